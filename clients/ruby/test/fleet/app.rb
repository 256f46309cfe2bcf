# frozen_string_literal: true

# The Sidekiq application of the fleet test (test_sidekiq_fleet.rb): each
# worker process loads it with `sidekiq -r`. Limits and addresses come from
# the environment the test sets.

require "socket"
require "tb_limiter/sidekiq"
Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)

REDIS_URL = ENV.fetch("TB_FLEET_REDIS")
API_PORT = Integer(ENV.fetch("TB_FLEET_API"))

# Records, for each job that ran its body, how many times it was
# re-scheduled before (the payload's tb_reschedules).
class FleetRecorder
  def call(_worker, job, _queue)
    ran = false
    yield.tap { ran = true }
  ensure
    Sidekiq.redis { |r| r.hset("fleet:hops", job["jid"], job["tb_reschedules"].to_i) } if ran
  end
end

# One call to the fake API: a line out, a line back.
def api_call(line)
  s = TCPSocket.new("127.0.0.1", API_PORT)
  s.write("#{line}\n")
  s.gets.to_s.strip
ensure
  s&.close
end

# The reserved form: one bucket per account.
class FleetJob
  include Sidekiq::Worker
  include TbLimiter::Sidekiq::Limited
  sidekiq_options queue: "api", retry: 3

  tb_limit rate: ENV.fetch("TB_FLEET_RATE"), capacity: Integer(ENV.fetch("TB_FLEET_CAPACITY")),
           key: ->(account, _i) { "fleet:acct:#{account}" }, max_wait: Float(ENV.fetch("TB_FLEET_MAX_WAIT"))

  def perform(account, _i)
    api_call("call #{account} #{jid}")
    Sidekiq.redis { |r| r.hincrby("fleet:runs", jid, 1) }
  end
end

# The leased form: requests per second, a token estimate settled to the
# use the API reports, in-flight slots.
class LeasedJob
  include Sidekiq::Worker
  include TbLimiter::Sidekiq::Limited
  sidekiq_options queue: "llm", retry: 3

  tb_lease key: ->(account, _i) { "fleet:llm:{#{account}}" }, ttl: 30,
           parts: {
             rpm: { rate: ENV.fetch("TB_FLEET_RPM_RATE"), capacity: Integer(ENV.fetch("TB_FLEET_RPM_CAPACITY")) },
             tpm: { rate: ENV.fetch("TB_FLEET_TPM_RATE"), capacity: Integer(ENV.fetch("TB_FLEET_TPM_CAPACITY")),
                    n: ->(_account, _i) { Integer(ENV.fetch("TB_FLEET_ESTIMATE")) } },
             inflight: { capacity: Integer(ENV.fetch("TB_FLEET_INFLIGHT")) }
           }

  def perform(account, _i)
    used = api_call("llm #{account} #{jid}")
    tb_used(:tpm, Integer(used))
    Sidekiq.redis { |r| r.hincrby("fleet:runs", jid, 1) }
  end
end

Sidekiq.configure_server do |config|
  config.redis = { url: REDIS_URL }
  # The scheduler polls every 0.1-0.3 s (below 10 processes), so the
  # middleware's lead is 1.5 x 0.2 + 0.1 = 0.4 s.
  config.options[:poll_interval_average] = 0.2
  config.server_middleware do |chain|
    chain.add FleetRecorder
    chain.add TbLimiter::Sidekiq::Middleware
  end
end
Sidekiq.configure_client { |config| config.redis = { url: REDIS_URL } }
