# frozen_string_literal: true

# The Ruby client against real servers: the module and, on a server without
# it, the Lua fallback (found from the first call's error, no probe).

require_relative "helper"
require "connection_pool"

class RatesTest < Minitest::Test
  R = TbLimiter::Rates

  def test_rate_strings_as_the_other_clients_read_them
    assert_equal "100/m", R.rate_arg("100/minute")
    assert_equal "100/m", R.rate_arg("100/m")
    assert_equal "10", R.rate_arg("10 per second")
    assert_equal "0.5", R.rate_arg("5 per 10 seconds")
    assert_equal "7/h", R.rate_arg("7/hour")
    assert_equal "0.5", R.rate_arg("0.5")
    assert_equal "0.5", R.rate_arg(0.5)
    assert_equal "3", R.rate_arg(3)
    assert_equal "100/m", R.rate_arg(Rational(5, 3))
    assert_equal [10, 1000], R.parse_limits("10/second;1000/day").map(&:amount)
    assert_raises(ArgumentError) { R.rate_arg("10/second;1000/day") }
    assert_raises(ArgumentError) { R.rate_arg("ten per second") }
    assert_raises(ArgumentError) { R.rate_arg(-1) }
    assert_raises(TypeError) { R.rate_arg(true) }
  end

  def test_a_rate_below_the_modules_precision_is_rounded_down_never_up
    per_second = R.per_second(R.rate_arg("1/month"))
    assert_operator per_second, :<=, Rational(1, 30 * 86_400)
    assert_operator per_second, :>, Rational(1, 30 * 86_400) * (1 - 1e-6)
  end

  def test_capacity_is_implied_by_a_limits_string_only
    lim = TbLimiter::Limiter.new(Object.new)
    assert_equal 100, lim.bucket("k", rate: "100/minute").capacity
    assert_raises(ArgumentError) { lim.bucket("k", rate: "100/m") }
  end
end

module BackendTests
  def setup
    @redis = self.class.server.client
    @redis.flushall
    @lim = TbLimiter::Limiter.new(@redis)
  end

  def teardown = @redis.close

  def test_the_backend_is_decided_by_the_first_call
    assert_nil @lim.backend
    @lim.bucket("k", rate: 1, capacity: 1).consume
    assert_equal expected_backend, @lim.backend
  end

  def test_no_probe_outside_the_callers_keys
    @redis.config("resetstat")
    @lim.bucket("k", rate: 1, capacity: 1).consume
    stats = @redis.info("commandstats").keys.map { _1.delete_prefix("cmdstat_") }
    assert_includes stats, expected_backend == :module ? "tb.consume" : "evalsha"
    assert_empty stats.grep(/\A(command|module|function|script)/), "no probe: #{stats}"
  end

  def test_consume_reserve_acquire_refund_info
    b = @lim.bucket("k", rate: "10/second")
    start = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    # Refill since the take shortens each wait below by as many ms as have
    # passed (10/s: a token is 100 ms): at most the time measured since just
    # before it (and 1 ms for rounding up).
    since = -> { ((Process.clock_gettime(Process::CLOCK_MONOTONIC) - start) * 1000).ceil + 1 }
    r = b.consume(4)
    assert r.allowed?
    assert_equal [6, 4], [r.remaining, r.granted]
    assert_equal 6, b.peek.remaining
    denied = b.consume(7)
    refute denied.allowed?
    # One token short: 100 ms, less what refilled since the take.
    assert_includes (100 - since.call)..100, denied.retry_after_ms
    assert b.consume(11).never?
    assert_equal 7, b.refund(1)
    info = b.info
    assert_equal [10, BigDecimal("10")], [info.capacity, info.rate]
    assert_equal 7, info.tokens.floor
    r = b.reserve(9)
    assert r.allowed?
    # 7 tokens after the refund: two short, 200 ms, less the refill.
    assert_includes (200 - since.call)..200, r.retry_after_ms
    t = Time.now
    assert b.acquire(1, timeout: 1).allowed?
    assert_operator Time.now - t, :>=, 0.25, "acquire slept the reserved wait"
  end

  def test_acquire_raises_rate_limited_with_the_wait
    b = @lim.bucket("slow", rate: "1/m", capacity: 1)
    b.consume
    e = assert_raises(TbLimiter::RateLimited) { b.acquire(timeout: 0.5) }
    assert_in_delta 60_000, e.retry_after_ms, 100
    assert_equal "slow", e.key
  end

  def test_block_waits_on_the_server_or_reserves_on_the_fallback
    b = @lim.bucket("bl", rate: 10, capacity: 1)
    first = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    assert b.block(1, timeout: 1).allowed?
    assert_equal expected_backend, @lim.backend, "decided by a first call that is a block"
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    assert b.block(1, timeout: 2).allowed?
    done = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    # The next token comes 100 ms after the first call took one (less 1 ms
    # for Redis 7.0's clock), and the call returns with it, not at its
    # timeout.
    assert_operator done - first, :>=, 0.099, "granted before the token came"
    assert_operator done - t, :<, 1.0, "answered at its grant, not at its 2 s timeout"
    assert_raises(TbLimiter::RateLimited) { @lim.bucket("never", rate: 0, capacity: 1).tap(&:consume).block(1, timeout: 0.2) }
  end

  def test_consume_many_is_all_or_nothing_across_hash_tagged_keys
    rpm = @lim.bucket("{u}:rpm", rate: "60/m", capacity: 2)
    tpm = @lim.bucket("{u}:tpm", rate: "1000/m", capacity: 1000)
    assert @lim.consume_many([[rpm, 1], [tpm, 600]]).allowed?
    r = @lim.consume_many([[rpm, 1], [tpm, 600]])
    refute r.allowed?
    assert_equal [1, 400], r.remaining
    assert @lim.consume_many([[rpm, 1], [tpm, 600]], max_wait: 30).allowed?
    g = @lim.limits("api:{bob}", "2/second;100/day")
    assert_equal %w[api:{bob}:2/1s api:{bob}:100/86400s], g.buckets.map(&:key)
    2.times { assert g.consume.allowed? }
    refute g.consume.allowed?
  end

  def test_a_lease_is_released_on_a_normal_exit_and_settled_to_the_use
    slots = @lim.bucket("slots", rate: 0, capacity: 2)
    tpm = @lim.bucket("{a}:tpm", rate: "1000/m", capacity: 1000)
    inflight = @lim.bucket("{a}:inflight", rate: 0, capacity: 2)
    slots.lease(ttl: 30) { |l| assert_operator l.id, :>, 0 }
    assert_equal 2, slots.info&.tokens || 2, "the slot came back"
    @lim.lease_many([[tpm, 300], [inflight, 1]], ttl: { 0 => 60, 1 => 60 }) do |l|
      assert_equal 2, l.ids.count(&:positive?)
      l.used[0] = 500
    end
    assert_equal 500, 1000 - tpm.info.tokens.round
    assert_equal 2, inflight.info&.tokens || 2
  end

  def test_a_raising_body_keeps_the_estimate_and_holds_the_slot
    tpm = @lim.bucket("{b}:tpm", rate: "1/d", capacity: 1000)
    inflight = @lim.bucket("{b}:inflight", rate: 0, capacity: 2)
    assert_raises(IOError) do
      @lim.lease_many([[tpm, 300], [inflight, 1]], ttl: { 0 => 60, 1 => 60 }) { raise IOError, "timed out" }
    end
    assert_equal 700, tpm.info.tokens.floor, "the estimate stays charged"
    assert_equal 1, inflight.info.tokens.to_i, "the slot stays held (the call may still run)"
  end

  def test_a_vanished_holder_keeps_the_estimate_and_frees_the_slot_at_the_ttl
    tpm = @lim.bucket("{v}:tpm", rate: "1/d", capacity: 1000)
    inflight = @lim.bucket("{v}:inflight", rate: 0, capacity: 2)
    # Never finished: as a worker killed mid-call leaves it.
    @lim.lease_many([[tpm, 300], [inflight, 1]], ttl: { 0 => 0.2, 1 => 0.2 })
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
    until (inflight.info&.tokens || 2).to_i == 2
      flunk "the slot never came back" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      sleep 0.02
    end
    assert_equal 700, tpm.info.tokens.floor, "the estimate (leased with KEEP) stays charged"
  end

  def test_not_sent_gives_everything_back
    rpm = @lim.bucket("{c}:rpm", rate: "1/d", capacity: 5)
    tpm = @lim.bucket("{c}:tpm", rate: "1/d", capacity: 1000)
    inflight = @lim.bucket("{c}:inflight", rate: 0, capacity: 2)
    parts = [[rpm, 1], [tpm, 300], [inflight, 1]]
    assert_raises(TbLimiter::NotSent) { @lim.lease_many(parts, ttl: { 1 => 60, 2 => 60 }) { raise TbLimiter::NotSent } }
    wrapped = assert_raises(RuntimeError) do
      @lim.lease_many(parts, ttl: { 1 => 60, 2 => 60 }) do
        raise TbLimiter::NotSent, "refused"
      rescue TbLimiter::NotSent
        raise "wrapped"
      end
    end
    assert_instance_of TbLimiter::NotSent, wrapped.cause
    assert_raises(Errno::ECONNREFUSED) do
      @lim.lease_many(parts, ttl: { 1 => 60, 2 => 60 }, not_sent: [Errno::ECONNREFUSED]) { raise Errno::ECONNREFUSED }
    end
    l = @lim.lease_many(parts, ttl: { 1 => 60, 2 => 60 })
    l.give_back
    assert_equal [], l.finish, "one settlement only"
    assert_equal [5, 1000, 2], [rpm, tpm, inflight].map { _1.info&.tokens&.floor || _1.capacity }
  end

  def test_a_denied_lease_is_polled_until_its_timeout
    slot = @lim.bucket("one", rate: 0, capacity: 1)
    held = slot.lease(ttl: 30)
    t = Time.now
    e = assert_raises(TbLimiter::RateLimited) { slot.lease(ttl: 30, timeout: 0.3) {} }
    assert_operator Time.now - t, :>=, 0.3
    refute e.result.allowed?
    Thread.new { sleep 0.2; held.finish }
    slot.lease(ttl: 30, timeout: 2) { |l| assert_operator l.id, :>, 0 }
  end

  def test_a_connection_pool_is_a_client_too
    pool = ConnectionPool.new(size: 2) { self.class.server.client }
    lim = TbLimiter::Limiter.new(pool)
    assert lim.bucket("p", rate: 1, capacity: 1).consume.allowed?
    assert_equal expected_backend, lim.backend
  ensure
    pool&.shutdown(&:close)
  end

  # RedisClient's interface (call, blocking_call) as the limiter uses it:
  # the redis-client gem is not in Debian, so a stand-in records the calls.
  class RedisClientStandIn
    attr_reader :blocking

    def initialize(redis)
      @redis = redis
      @blocking = []
    end

    def call(*args) = @redis.call(*args)

    def blocking_call(timeout, *args)
      @blocking << timeout
      @redis.call(*args)
    end
  end

  def test_a_redis_client_is_called_as_redis_client_is
    client = RedisClientStandIn.new(@redis)
    lim = TbLimiter::Limiter.new(client)
    b = lim.bucket("rc", rate: 10, capacity: 1)
    assert b.consume.allowed?
    assert b.block(1, timeout: 1).allowed?
    assert_equal(expected_backend == :module ? 1 : 0, client.blocking.size, "a server-side wait is a blocking_call")
    assert_operator client.blocking.first, :>, 1, "its timeout covers the wait" if expected_backend == :module
  end

  def test_server_errors_come_through
    e = assert_raises(Redis::CommandError) { @lim.execute(TbLimiter::Protocol::Call.new("TB.CONSUME", ["x"], %w[abc 1 1])) }
    assert_match(/rate must be a non-negative decimal/, e.message)
  end
end

class ModuleClientTest < Minitest::Test
  include BackendTests
  class << self
    attr_accessor :server
  end
  def expected_backend = :module
end

class LuaClientTest < Minitest::Test
  include BackendTests
  class << self
    attr_accessor :server
  end
  def expected_backend = :lua
end

ModuleClientTest.server = TestServers::Server.new(with_module: true)
LuaClientTest.server = TestServers::Server.new(with_module: false)
Minitest.after_run do
  ModuleClientTest.server.stop
  LuaClientTest.server.stop
end
