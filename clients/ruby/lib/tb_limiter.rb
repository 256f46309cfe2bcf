# frozen_string_literal: true

# A fleet-wide token bucket limiter for Redis: the tb module's commands, or
# the same commands through the shipped Lua script on servers without it.
# See README.md; the Sidekiq integration is `require "tb_limiter/sidekiq"`.
module TbLimiter; end

require_relative "tb_limiter/version"
require_relative "tb_limiter/catalogue"
require_relative "tb_limiter/rates"
require_relative "tb_limiter/protocol"
require_relative "tb_limiter/results"
require_relative "tb_limiter/calls"
require_relative "tb_limiter/limiter"
require_relative "tb_limiter/bucket"
require_relative "tb_limiter/lease"
