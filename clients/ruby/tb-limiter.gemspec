# frozen_string_literal: true

require_relative "lib/tb_limiter/version"

Gem::Specification.new do |s|
  s.name = "tb-limiter"
  s.version = TbLimiter::VERSION
  s.summary = "Fleet-wide token buckets, leases and server-side waiting on Redis (tb module or Lua fallback), with Sidekiq"
  s.description = "Client of the tb Redis module: consume, reserve, block, acquire, refund, leases with settling, " \
                  "multi-bucket calls, a byte-identical Lua fallback for servers without the module, and a Sidekiq " \
                  "middleware that re-schedules a limited job for its turn instead of sleeping or burning a retry."
  s.authors = ["tb contributors"]
  s.license = "MIT"
  s.files = Dir["lib/**/*.rb"] + ["lib/tb_limiter/tb.lua", "README.md"]
  s.require_paths = ["lib"]
  s.required_ruby_version = ">= 3.0"
  s.add_dependency "redis", ">= 4.2", "< 6"
end
