# frozen_string_literal: true

# TbLimiter::Sidekiq::Middleware called directly, as a Sidekiq processor
# calls it, against a real server: what runs, what is re-scheduled (and
# how), what a leased job's failure leaves held.

require_relative "helper"
require "sidekiq"
require "sidekiq/api"
require "tb_limiter/sidekiq"
require "connection_pool"

class LimitedJob
  include Sidekiq::Worker
  include TbLimiter::Sidekiq::Limited
  tb_limit rate: 1, capacity: 1, key: ->(account) { "mw:acct:#{account}" }, max_wait: 3
end

class NearJob
  include Sidekiq::Worker
  include TbLimiter::Sidekiq::Limited
  tb_limit rate: 1, capacity: 1, key: "mw:near", max_wait: 0.5
end

class LeasedMwJob
  include Sidekiq::Worker
  include TbLimiter::Sidekiq::Limited
  tb_lease key: ->(account) { "mw:llm:{#{account}}" }, ttl: 60,
           parts: { rpm: { rate: "1/d", capacity: 5 }, tpm: { rate: "1/d", capacity: 1000, n: ->(_) { 300 } },
                    inflight: { capacity: 1 } }
end

class PlainJob
  include Sidekiq::Worker
end

class SidekiqMiddlewareTest < Minitest::Test
  def self.with_module = true

  def self.run(reporter, options = {})
    @server = TestServers::Server.new(with_module: with_module)
    Sidekiq.configure_client { |c| c.redis = { url: @server.url } }
    super
  ensure
    @server&.stop
  end

  class << self
    attr_reader :server
  end

  def setup
    @redis = self.class.server.client
    @redis.flushall
    @lim = TbLimiter::Limiter.new(@redis)
    TbLimiter::Sidekiq.limiter = @lim
    TbLimiter::Sidekiq.lead = 0.2
    TbLimiter::Sidekiq.queue_limits.clear
    @mw = TbLimiter::Sidekiq::Middleware.new
  end

  def teardown
    TbLimiter::Sidekiq.lead = nil
    @redis.close
  end

  def job(klass, *args, **extra)
    { "class" => klass.name, "args" => args, "jid" => SecureRandom.hex(12), "queue" => "default", "retry" => true,
      "created_at" => Time.now.to_f, "enqueued_at" => Time.now.to_f }.merge(extra.transform_keys(&:to_s))
  end

  def run_job(klass, payload, &body)
    ran = false
    @mw.call(klass.new, payload, payload["queue"]) do
      ran = true
      body&.call
    end
    ran
  end

  def scheduled = Sidekiq::ScheduledSet.new.to_a

  # Whole tokens in a bucket (a full one may have no key).
  def tokens(bucket) = bucket.info&.tokens&.floor || bucket.capacity

  def test_a_job_whose_turn_is_later_is_rescheduled_for_it_not_retried
    first = Time.now.to_f
    assert run_job(LimitedJob, job(LimitedJob, "a"))
    second = job(LimitedJob, "a")
    refute run_job(LimitedJob, second), "not run before its turn"
    after = Time.now.to_f
    assert_equal 1, scheduled.size
    s = scheduled.first
    assert_equal second["jid"], s.jid, "the same job, not a copy"
    assert_equal ["a"], s.args
    # Its turn is when the bucket (1/s) has its next token: 1 s after the
    # first job took the last one (less 1 ms for Redis 7.0's clock), and at
    # the latest 1 s after the reservation's reply.
    assert_includes (first + 0.999)..(after + 1.0), s.item["tb_turn"], "its turn: the reservation's wait"
    assert_in_delta s.item["tb_turn"] - 0.2, s.at.to_f, 0.01, "brought back the lead before the turn"
    assert_equal 1, s.item["tb_reschedules"]
    assert_nil s.item["retry_count"], "no retry burned"
    assert run_job(LimitedJob, job(LimitedJob, "b")), "another account has its own bucket"

    # Brought back early, it sleeps to its turn and runs.
    back = s.item
    s.delete
    t0 = Time.now.to_f
    assert run_job(LimitedJob, back)
    assert_operator Time.now.to_f, :>=, back["tb_turn"]
    assert_operator Time.now.to_f - t0, :<, 1.1
  end

  def test_a_turn_beyond_the_reach_takes_nothing_and_asks_again_later
    assert run_job(NearJob, job(NearJob))
    refute run_job(NearJob, job(NearJob)) # 1 s away, reach 0.5 s: denied
    s = scheduled.first
    assert_nil s.item["tb_turn"], "nothing reserved"
    assert_operator s.at.to_f - Time.now.to_f, :>, 0.2, "not sooner than half the reach"
    assert_equal 0, @lim.bucket("mw:near", rate: 1, capacity: 1).info.tokens.floor, "no debt taken"
  end

  def test_a_job_back_past_its_turn_gives_it_back_and_takes_a_new_one
    b = @lim.bucket("mw:acct:late", rate: 1, capacity: 1)
    assert b.reserve(1).allowed? # the turn this job held, now
    late = job(LimitedJob, "late", tb_turn: Time.now.to_f - 5, tb_reschedules: 1)
    assert run_job(LimitedJob, late), "its refunded token serves the new turn at once"
    assert_equal 0, b.info.tokens.round, "one token used, not two"
  end

  def test_more_than_the_capacity_is_a_failure
    never = Class.new(LimitedJob) { tb_limit rate: 1, capacity: 1, n: 2, key: "mw:never" }
    Object.const_set(:NeverJob, never) unless defined?(NeverJob)
    assert_raises(TbLimiter::RateLimited) { run_job(NeverJob, job(NeverJob)) }
  end

  def test_a_queue_default_applies_to_classes_without_their_own
    TbLimiter::Sidekiq.limit_queue("slow", rate: 1, capacity: 1, key: ->(*) { "mw:queue:slow" })
    assert run_job(PlainJob, job(PlainJob, queue: "slow"))
    refute run_job(PlainJob, job(PlainJob, queue: "slow"))
    assert run_job(PlainJob, job(PlainJob, queue: "other"))
  end

  def test_leased_job_settles_on_success_and_keeps_on_failure
    tpm = @lim.bucket("mw:llm:{a}:tpm", rate: "1/d", capacity: 1000)
    inflight = @lim.bucket("mw:llm:{a}:inflight", rate: 0, capacity: 1)
    w = LeasedMwJob.new
    @mw.call(w, job(LeasedMwJob, "a"), "default") { w.tb_used(:tpm, 120) }
    assert_equal 880, tpm.info.tokens.floor, "settled to the use reported"
    assert_equal 1, tokens(inflight), "slot released"

    assert_raises(Timeout::Error) { @mw.call(w, job(LeasedMwJob, "a"), "default") { raise Timeout::Error } }
    assert_equal 580, tpm.info.tokens.floor, "the estimate stays charged"
    assert_equal 0, tokens(inflight), "the slot stays held: the call may still run"

    busy = job(LeasedMwJob, "a")
    refute run_job(LeasedMwJob, busy), "no slot: not run"
    assert_equal busy["jid"], scheduled.first.jid
    assert_nil scheduled.first.item["tb_turn"]

    c = job(LeasedMwJob, "c")
    assert_raises(TbLimiter::NotSent) { @mw.call(w, c, "default") { raise TbLimiter::NotSent, "refused" } }
    left = { "rpm" => 5, "tpm" => 1000, "inflight" => 1 }.map { |p, cap| tokens(@lim.bucket("mw:llm:{c}:#{p}", rate: 0, capacity: cap)) }
    assert_equal [5, 1000, 1], left, "not sent: everything given back"
  end
end

# The same on a server without the module: the Lua fallback.
class SidekiqMiddlewareLuaTest < SidekiqMiddlewareTest
  def self.with_module = false

  def test_the_fallback_answers
    run_job(LimitedJob, job(LimitedJob, "x"))
    assert_equal :lua, @lim.backend
  end
end

# Fair share: a job's flow (its tenant argument) and weight, from the job.
class FlowJob
  include Sidekiq::Worker
  include TbLimiter::Sidekiq::Limited
  tb_limit rate: "1/h", capacity: 2, key: "mw:flow", max_wait: 20,
           flow: ->(job) { job["args"].first }, weight: ->(job) { job["args"][1] }
end

class ShortFlowJob
  include Sidekiq::Worker
  include TbLimiter::Sidekiq::Limited
  tb_limit rate: "1/h", capacity: 2, key: "mw:flow", max_wait: 0.3, flow: "batch"
end

class FlowLeaseJob
  include Sidekiq::Worker
  include TbLimiter::Sidekiq::Limited
  tb_lease key: "mw:fl:{x}", ttl: 30, max_wait: 20, flow: ->(job) { "t-#{job["args"].first}" },
           parts: { inflight: { capacity: 1 } }
end

# Jobs of two tenants on one partner API of 50/s.
class FairJob
  include Sidekiq::Worker
  include TbLimiter::Sidekiq::Limited
  tb_limit rate: 50, capacity: 1, key: "mw:fair", max_wait: 10, flow: ->(job) { job["args"].first }
end

class SidekiqFlowTest < SidekiqMiddlewareTest
  # The tests of this class only (the base class's run on their own).
  def self.runnable_methods = SidekiqFlowTest.public_instance_methods(false).grep(/\Atest_/).map(&:to_s)

  def setup
    super
    # Waiting jobs each hold a connection, as with Sidekiq's own pool.
    @pool = ConnectionPool.new(size: 12) { self.class.server.client }
    @lim = TbLimiter::Limiter.new(@pool)
    TbLimiter::Sidekiq.limiter = @lim
  end

  def teardown
    @pool.shutdown(&:close)
    super
  end

  def mono = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def wait_until(what, seconds = 10)
    deadline = mono + seconds
    until (v = yield)
      flunk "#{what} within #{seconds} s" if mono > deadline
      sleep 0.01
    end
    v
  end

  def flow_bucket = @lim.bucket("mw:flow", rate: "1/h", capacity: 2)

  def test_a_job_waits_in_its_tenants_flow_until_granted
    assert flow_bucket.consume(2).allowed?
    jobs = [job(FlowJob, "tenant-a", 3), job(FlowJob, 42, nil)]
    runs = jobs.map { |j| Thread.new { run_job(FlowJob, j) } }
    info = wait_until("both jobs waiting") { (i = flow_bucket.info) && i.waiting == 2 && i }
    assert_equal [["42", 1, 1], ["tenant-a", 3, 1]], info.flows.map(&:to_a).sort, "the flow and weight of each job"
    flow_bucket.refund(2)
    assert_equal [true, true], runs.map(&:value), "each ran once granted"
    assert_empty scheduled, "nothing re-scheduled"
  end

  # Worker threads run jobs of tenant A (9 threads) and B (3), each taking
  # its next job as soon as one ran. While both wait the queue alternates
  # the tenants (within a grant); B's 3 threads keep it waiting while one
  # of them runs its job and comes back (20 ms between grants at 50/s).
  # The allowance of 8 of 80 (10%) is for a thread of B that comes back
  # later than that on a loaded machine.
  def test_waiting_jobs_of_two_tenants_share_the_limit
    order = Queue.new
    stop = false
    threads = [["A"] * 9, ["B"] * 3].flatten.map do |tenant|
      Thread.new do
        run_job(FairJob, job(FairJob, tenant)) { order << tenant } until stop
      end
    end
    # 92 runs take 1.8 s at 50/s.
    begin
      seen = wait_until("92 jobs run", 30) { order.size >= 92 && Array.new(92) { order.pop } }.last(80)
    ensure
      stop = true
      threads.each(&:join)
    end
    warn "  Sidekiq fair share: tenant B's jobs ran #{seen.count("B")} of #{seen.size} (A: 9 threads, B: 3)"
    assert_in_delta 40, seen.count("B"), 8, "B's share while both wait: #{seen.join}"
    assert_empty scheduled, "every job ran within its wait"
  end

  def test_a_job_whose_wait_runs_out_is_rescheduled_holding_nothing
    assert flow_bucket.consume(2).allowed?
    payload = job(ShortFlowJob)
    t = mono
    refute run_job(ShortFlowJob, payload)
    assert_operator mono - t, :>=, 0.29, "waited in its flow's queue"
    s = scheduled.first
    assert_equal payload["jid"], s.jid
    assert_nil s.item["tb_turn"], "holds no turn"
    assert_equal 1, s.item["tb_reschedules"]
    assert_equal 0, flow_bucket.info.tokens.floor, "no debt taken"
  end

  def test_a_leased_job_waits_in_its_flow_for_a_slot
    slot = @lim.bucket("mw:fl:{x}:inflight", rate: 0, capacity: 1)
    held = slot.lease(ttl: 30)
    run = Thread.new { run_job(FlowLeaseJob, job(FlowLeaseJob, "a")) }
    info = wait_until("the job waiting") { (i = slot.info) && i.waiting == 1 && i }
    assert_equal [["t-a", 1, 1]], info.flows.map(&:to_a)
    held.finish
    assert run.value
    assert_empty scheduled
  end

  def test_a_bad_flow_is_refused
    e = assert_raises(ArgumentError) { Class.new(FlowJob) { tb_limit rate: 1, capacity: 1, key: "k", flow: "" } }
    assert_equal TbLimiter::Protocol::ERR_FLOW_NAME, e.message
    assert_raises(ArgumentError) { run_job(FlowJob, job(FlowJob, "a", 0)) }
    assert_nil flow_bucket.info, "refused before any round trip"
  end
end

# On the Lua fallback the flow is ignored: a job reserves and is
# re-scheduled as without one.
class SidekiqFlowLuaTest < SidekiqFlowTest
  def self.with_module = false
  def self.runnable_methods = SidekiqFlowLuaTest.public_instance_methods(false).grep(/\Atest_/).map(&:to_s)

  def test_the_flow_is_ignored_and_the_job_reserves
    assert run_job(FlowJob, job(FlowJob, "tenant-a"))
    assert_equal :lua, @lim.backend
    b = @lim.bucket("mw:flow", rate: "1/h", capacity: 2)
    assert run_job(FlowJob, job(FlowJob, "tenant-b")), "a token left"
    refute run_job(FlowJob, job(FlowJob, "tenant-a")), "the next is an hour away: re-scheduled, not waiting"
    assert_nil scheduled.first.item["tb_turn"], "beyond the reach: nothing reserved"
    assert_equal 0, b.info.tokens.floor
  end
end
