# frozen_string_literal: true

# Fair share (issue 22): flow: and weight: on the calls that wait. The
# arguments as sent and the client-side checks on a recording client; the
# queue on the module (grants shared by weight, TB.INFO's flows); the Lua
# fallback, which ignores the flow.

require_relative "helper"

# A client that records every command and answers from a block, as
# RedisClient is called (call, blocking_call).
class RecordingClient
  attr_reader :calls

  def initialize(&answer)
    @answer = answer
    @calls = []
  end

  def call(*args)
    @calls << [nil, args]
    @answer.call(args)
  end

  def blocking_call(timeout, *args)
    @calls << [timeout, args]
    @answer.call(args)
  end
end

class FlowArgsTest < Minitest::Test
  P = TbLimiter::Protocol
  GRANT = [1, 0, 0, 20, 1].freeze

  def setup
    @client = RecordingClient.new do |args|
      case args[0]
      when "TB.CONSUME" then GRANT
      when "TB.MCONSUME"
        k = Integer(args[1]) # remaining per part; with LEASE, a lease id for the first part
        [1, 0, *[0] * k, *([7, *[0] * (k - 1)] if args.include?("LEASE"))]
      end
    end
    @lim = TbLimiter::Limiter.new(@client, backend: :module)
    @b = @lim.bucket("k", rate: 50, capacity: 1)
  end

  def sent = @client.calls.map(&:last)

  # Every call that waits, with the flow options given.
  def each_waiting_call(**fl)
    other = @lim.bucket("{t}:b", rate: 1, capacity: 1)
    yield -> { @b.acquire(1, timeout: 1, **fl) }
    yield -> { @b.block(1, timeout: 1, **fl) }
    yield -> { @b.lease(1, ttl: 5, timeout: 1, **fl) }
    yield -> { @lim.acquire_many([[@b, 1], [other, 1]], timeout: 1, **fl) }
    yield -> { @lim.lease_many([[@b, 1], [other, 1]], ttl: { 0 => 5 }, timeout: 1, **fl) }
    yield -> { @lim.limits("g", "2/second;100/day").acquire(1, timeout: 1, **fl) }
  end

  def test_a_bad_flow_or_weight_is_refused_with_the_servers_error_before_any_round_trip
    bad = [
      [{ flow: "" }, P::ERR_FLOW_NAME],
      [{ flow: "x" * 129 }, P::ERR_FLOW_NAME],
      [{ flow: "é" * 65 }, P::ERR_FLOW_NAME], # 130 bytes in 65 characters
      [{ flow: "a", weight: 0 }, P::ERR_WEIGHT],
      [{ flow: "a", weight: 1_000_001 }, P::ERR_WEIGHT],
      [{ flow: "a", weight: 1.5 }, P::ERR_WEIGHT],
      [{ flow: "a", weight: "2" }, P::ERR_WEIGHT],
      [{ weight: 2 }, P::ERR_WEIGHT]
    ]
    bad.each do |fl, message|
      each_waiting_call(**fl) do |call|
        e = assert_raises(ArgumentError, fl.inspect) { call.call }
        assert_equal message, e.message
      end
    end
    each_waiting_call(flow: :tenant) { |call| assert_raises(TypeError) { call.call } }
    assert_empty @client.calls, "no round trip"
  end

  def test_the_flow_goes_after_block_and_weight_only_when_not_1
    @b.acquire(1, timeout: 2, flow: "acme")
    @b.acquire(1, timeout: 2, flow: "acme", weight: 1)
    @b.acquire(1, timeout: 2, flow: "a" * 128, weight: 1_000_000)
    @b.block(2, timeout: 0.5, flow: "é" * 64, weight: 3)
    expect = %w[TB.CONSUME k 50 1 1 BLOCK 2000 FLOW acme]
    assert_equal [expect, expect,
                  ["TB.CONSUME", "k", "50", "1", "1", "BLOCK", "2000", "FLOW", "a" * 128, "WEIGHT", "1000000"],
                  ["TB.CONSUME", "k", "50", "1", "2", "BLOCK", "500", "FLOW", "é" * 64, "WEIGHT", "3"]], sent
    timeouts = @client.calls.map(&:first)
    covered = timeouts.each_with_index.all? { |t, i| t && t > [2, 2, 2, 0.5][i] }
    assert covered, "a blocking call whose read timeout covers the wait: #{timeouts}"
  end

  def test_multi_bucket_and_leased_calls_carry_the_flow
    other = @lim.bucket("{t}:b", rate: 1, capacity: 1)
    mine = @lim.bucket("{t}:a", rate: 0, capacity: 2)
    @lim.acquire_many([[mine, 1], [other, 1]], timeout: 3, flow: "t1", weight: 2)
    l = @lim.lease_many([[mine, 1], [other, 1]], ttl: { 0 => 5 }, timeout: 3, flow: "t1")
    assert_equal [7, 0], l.ids
    mine.lease(1, ttl: 2, timeout: 1, flow: "t2", weight: 9)
    assert_equal [%w[TB.MCONSUME 2 {t}:a {t}:b 0 2 1 1 1 1 BLOCK 3000 FLOW t1 WEIGHT 2],
                  %w[TB.MCONSUME 2 {t}:a {t}:b 0 2 1 1 1 1 LEASE 1 5000 BLOCK 3000 FLOW t1],
                  %w[TB.MCONSUME 1 {t}:a 0 2 1 LEASE 1 2000 BLOCK 1000 FLOW t2 WEIGHT 9]], sent
    assert(@client.calls.all? { |t, _| t }, "each is a blocking call")
  end

  def test_without_a_flow_nothing_changes
    @b.acquire(1, timeout: 2)
    @lim.bucket("s", rate: 0, capacity: 1).lease(1, ttl: 5, timeout: 0)
    assert_equal ["TB.CONSUME", "k", "50", "1", "1", "RESERVE"], sent[0][0, 6]
    assert_includes 1990..2000, Integer(sent[0][6]), "the time left of the timeout"
    assert_equal %w[TB.MCONSUME 1 s 0 1 1 LEASE 1 5000], sent[1]
    assert_equal [nil, nil], @client.calls.map(&:first), "no blocking call"
  end

  def test_info_reads_the_waiting_flows
    reply = ["tokens", "0.5", "capacity", 1, "rate", "50", "updated_at_ms", 1, "reset_after_ms", 10, "ttl_ms", 10,
             "waiting", 4, "waiting_flows", ["b", 1, 1, "a", 3, 3]]
    info = TbLimiter::BucketInfo.from_reply(reply)
    assert_equal 4, info.waiting
    assert_equal [["b", 1, 1], ["a", 3, 3]], info.flows.map(&:to_a)
    quiet = TbLimiter::BucketInfo.from_reply(reply[0, 12])
    assert_equal [0, []], [quiet.waiting, quiet.flows]
  end
end

module FlowServer
  def self.included(base)
    base.extend(ClassMethods)
  end

  module ClassMethods
    attr_accessor :server
  end

  def setup
    @redis = self.class.server.client
    @redis.flushall
    @lim = TbLimiter::Limiter.new(@redis)
  end

  def teardown = @redis.close

  def mono = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # A limiter on its own connection (a waiting call holds it).
  def own_limiter = TbLimiter::Limiter.new(self.class.server.client)

  def wait_until(what, seconds = 10)
    deadline = mono + seconds
    until (v = yield)
      flunk "#{what} within #{seconds} s" if mono > deadline
      sleep 0.01
    end
    v
  end
end

class ModuleFlowTest < Minitest::Test
  include FlowServer

  def test_the_clients_checks_are_the_servers
    p = TbLimiter::Protocol
    [[%w[FLOW], nil], [["FLOW", "x" * 129], p::ERR_FLOW_NAME], [%w[FLOW a WEIGHT 0], p::ERR_WEIGHT],
     [%w[FLOW a WEIGHT 1000001], p::ERR_WEIGHT]].each do |extra, message|
      e = assert_raises(Redis::CommandError) { @redis.call("TB.CONSUME", "k", "1", "1", "1", "BLOCK", "10", *extra) }
      assert_equal message, e.message if message
    end
  end

  # Threads of flow A (`a` threads, weight `wa`) and B (`b`, `wb`) take one
  # token at a time from a bucket of 50/s, capacity 1, each as soon as its
  # previous one was granted. Returns the flows of `total` grants that come
  # after `warm` grants (every thread waiting by then).
  def grants(a:, b:, wa: 1, wb: 1, warm: 12, total: 80)
    order = Queue.new
    stop = false
    threads = [["A", a, wa], ["B", b, wb]].flat_map do |name, count, w|
      Array.new(count) do
        Thread.new do
          lim = own_limiter
          bucket = lim.bucket("fair", rate: 50, capacity: 1)
          until stop
            bucket.acquire(1, timeout: 10, flow: name, weight: w)
            order << name
          end
        ensure
          lim&.client&.close
        end
      end
    end
    # warm + total grants take (warm + total) / 50 s.
    begin
      seen = wait_until("#{warm + total} grants", 30) { order.size >= warm + total && Array.new(warm + total) { order.pop } }
    ensure
      stop = true
      threads.each(&:join)
    end
    seen.last(total)
  end

  # The scheduler alternates the flows exactly while both wait (a grant
  # each per weight, within one grant); B's 3 threads keep it waiting while
  # one of them is granted and asks again (a 20 ms gap between grants at
  # 50/s). The allowance of 8 of 80 (10%) is for a thread of B that, on a
  # loaded machine, asks again later than that.
  def test_two_flows_share_a_saturated_bucket_equally
    seen = grants(a: 9, b: 3)
    share_b = seen.count("B")
    warn "  fair share, equal weights: B got #{share_b} of #{seen.size} grants (A: 9 threads, B: 3)"
    assert_in_delta seen.size / 2, share_b, seen.size / 10, "B's share while both wait: #{seen.join}"
  end

  def test_weights_divide_the_grants
    seen = grants(a: 6, b: 6, wa: 3, wb: 1)
    share_b = seen.count("B")
    warn "  fair share, weights 3:1: B got #{share_b} of #{seen.size} grants"
    assert_in_delta seen.size / 4, share_b, seen.size / 10, "B's share at weight 1 against 3: #{seen.join}"
  end

  def test_info_shows_the_flows_while_they_wait
    bucket = @lim.bucket("slow", rate: "1/h", capacity: 4)
    assert bucket.consume(4).allowed?
    waiting = [["A", 2], ["A", 2], ["A", 2], ["B", 1]].map do |flow, w|
      Thread.new do
        lim = own_limiter
        lim.bucket("slow", rate: "1/h", capacity: 4).acquire(1, timeout: 20, flow: flow, weight: w)
      ensure
        lim&.client&.close
      end
    end
    info = wait_until("four calls waiting") { (i = bucket.info) && i.waiting == 4 && i }
    assert_equal [["A", 2, 3], ["B", 1, 1]], info.flows.map(&:to_a).sort
    assert_equal 0, info.tokens.floor, "waiting calls take nothing"
    bucket.refund(4)
    assert(waiting.map(&:value).all?(&:allowed?), "each granted once the tokens are back")
    assert_equal [0, []], [bucket.info.waiting, bucket.info.flows]
  end

  def test_a_lease_waits_in_its_flows_queue_until_a_slot_comes_back
    slot = @lim.bucket("slot", rate: 0, capacity: 1)
    held = slot.lease(ttl: 30)
    got = Thread.new do
      lim = own_limiter
      lim.bucket("slot", rate: 0, capacity: 1).lease(ttl: 30, timeout: 20, flow: "t") { |l| [l.id, mono] }
    ensure
      lim&.client&.close
    end
    info = wait_until("the lease waiting") { (i = slot.info) && i.waiting == 1 && i }
    assert_equal [["t", 1, 1]], info.flows.map(&:to_a)
    released = mono
    held.finish
    id, at = got.value
    assert_operator id, :>, 0
    assert_operator at - released, :<, 1.0, "woken by the release, not by a poll"
  end

  def test_a_multi_bucket_call_waits_on_the_bucket_that_makes_it_wait
    roomy = @lim.bucket("{m}:roomy", rate: "1/h", capacity: 10)
    tight = @lim.bucket("{m}:tight", rate: "1/h", capacity: 1)
    tight.consume
    call = Thread.new do
      lim = own_limiter
      lim.acquire_many([[lim.bucket("{m}:roomy", rate: "1/h", capacity: 10), 2],
                        [lim.bucket("{m}:tight", rate: "1/h", capacity: 1), 1]], timeout: 20, flow: "x", weight: 5)
    ensure
      lim&.client&.close
    end
    info = wait_until("the call waiting") { (i = tight.info) && i.waiting == 1 && i }
    assert_equal [["x", 5, 1]], info.flows.map(&:to_a)
    assert_nil roomy.info, "nothing taken from the other bucket while it waits"
    tight.refund(1)
    assert call.value.allowed?
    assert_equal 8, roomy.info.tokens.floor
  end

  # redis-rb reads a blocking command's reply with its read timeout plus
  # the extra time given (as for BLPOP): a wait longer than the client's
  # own read timeout is not cut short.
  def test_a_wait_longer_than_the_clients_read_timeout
    redis = self.class.server.client(read_timeout: 0.2)
    bucket = TbLimiter::Limiter.new(redis).bucket("slow-read", rate: "60/m", capacity: 1)
    bucket.consume
    t = mono
    assert bucket.acquire(1, timeout: 3, flow: "a").allowed?
    assert_operator mono - t, :>, 0.5, "granted at the refill, about 1 s later"
  ensure
    redis&.close
  end

  # A timeout longer than the server's tb.max-wait-ms: refused once, the
  # limit is learnt, and the wait goes on in calls of at most that.
  def test_a_timeout_beyond_the_servers_longest_wait_is_waited_in_parts
    was = @redis.call("CONFIG", "GET", "tb.max-wait-ms")[1]
    @redis.call("CONFIG", "SET", "tb.max-wait-ms", "300")
    lim = own_limiter
    bucket = lim.bucket("parts", rate: "1.5", capacity: 1) # a token every 667 ms
    bucket.consume
    t = mono
    assert bucket.acquire(1, timeout: 3, flow: "a").allowed?
    assert_operator mono - t, :>, 0.5, "granted at the refill, after more than one 300 ms wait"
    assert_equal 0.3, lim.max_wait
  ensure
    lim&.client&.close
    @redis.call("CONFIG", "SET", "tb.max-wait-ms", was) if was
  end

  # Past tb.max-blocked the server answers a queued call at once: the
  # client pauses until the tokens are due instead of asking in a loop.
  def test_a_call_answered_before_its_wait_pauses_until_the_tokens_are_due
    was = @redis.call("CONFIG", "GET", "tb.max-blocked")[1]
    @redis.call("CONFIG", "SET", "tb.max-blocked", "0")
    bucket = @lim.bucket("nowait", rate: "2", capacity: 1) # a token every 500 ms
    bucket.consume
    @redis.call("CONFIG", "RESETSTAT")
    t = mono
    assert bucket.acquire(1, timeout: 3, flow: "a").allowed?
    assert_operator mono - t, :>, 0.4, "granted at the refill"
    calls = @redis.info("commandstats").dig("tb.consume", "calls").to_i
    assert_operator calls, :<=, 4, "a few tries, not a busy loop"
  ensure
    @redis.call("CONFIG", "SET", "tb.max-blocked", was) if was
  end

  def test_a_wait_that_runs_out_raises_and_takes_nothing
    bucket = @lim.bucket("out", rate: "1/h", capacity: 1)
    bucket.consume
    t = mono
    e = assert_raises(TbLimiter::RateLimited) { bucket.acquire(1, timeout: 0.3, flow: "a") }
    assert_operator mono - t, :>=, 0.29, "waited on the server"
    refute e.result.allowed?
    assert_equal 0, bucket.info.tokens.floor, "no debt taken"
    assert_equal :module, @lim.backend
  end
end

class LuaFlowTest < Minitest::Test
  include FlowServer

  # The real client, recording what it is asked to run.
  class Recorder
    attr_reader :calls

    def initialize(redis)
      @redis = redis
      @calls = []
    end

    def call(*args)
      @calls << args
      @redis.call(*args)
    end
  end

  def test_the_fallback_ignores_the_flow_and_reserves
    rec = Recorder.new(@redis)
    lim = TbLimiter::Limiter.new(rec)
    b = lim.bucket("lua", rate: 10, capacity: 1)
    assert b.acquire(1, timeout: 1, flow: "a", weight: 3).allowed?
    assert_equal :lua, lim.backend
    t = mono
    assert b.acquire(1, timeout: 1, flow: "a").allowed?
    assert_operator mono - t, :>=, 0.05, "reserved, then slept on the client"
    slot = lim.bucket("lua:slot", rate: 0, capacity: 1)
    slot.lease(ttl: 5, timeout: 1, flow: "a") { |l| assert_operator l.id, :>, 0 }
    scripts = rec.calls.reject { _1[0].start_with?("TB.") }
    refute_empty scripts
    assert(scripts.none? { |c| c.include?("FLOW") }, "the flow is not sent to the script: #{scripts}")
    assert_raises(ArgumentError) { b.acquire(1, flow: "") }
  end
end

ModuleFlowTest.server = TestServers::Server.new(with_module: true)
LuaFlowTest.server = TestServers::Server.new(with_module: false)
Minitest.after_run do
  ModuleFlowTest.server.stop
  LuaFlowTest.server.stop
end
