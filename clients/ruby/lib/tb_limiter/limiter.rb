# frozen_string_literal: true

module TbLimiter
  # Entry point: `TbLimiter::Limiter.new(redis)`.
  #
  # `client` is the application's own client, used as is (never closed):
  # a redis-rb `Redis` (also one made with `cluster:`), a `RedisClient`, or
  # a `ConnectionPool` of either (Sidekiq's own, for instance). Anything
  # that answers `call(*args)` works.
  #
  # `backend: :auto` uses the tb module and falls back to the Lua script
  # (same commands, same replies) the first time the server answers
  # "unknown command": no probe, no key outside the caller's own.
  # `:module` or `:lua` force one.
  class Limiter
    # First and longest pause between two tries of a denied lease: its
    # retry_after is when enough leases expire, and a release can come any
    # time before, so a lease is polled, backing off.
    LEASE_POLL = [0.01, 0.5].freeze
    BACKENDS = %i[auto module lua].freeze

    attr_reader :client

    def initialize(client, backend: :auto)
      raise ArgumentError, "backend must be one of #{BACKENDS.inspect}, not #{backend.inspect}" unless BACKENDS.include?(backend)
      raise TypeError, "Limiter takes a Redis client (or a ConnectionPool of them), not a #{client.class}" if client.is_a?(String)

      @client = client
      @backend = backend == :auto ? nil : backend
      @max_wait_ms = nil
    end

    # :module or :lua: which implementation answers; nil until the first
    # call has decided (backend: :auto).
    attr_reader :backend

    # The server's longest wait in seconds, once it has refused a longer one
    # (tb.max-wait-ms); nil until then.
    def max_wait = @max_wait_ms && @max_wait_ms / 1000.0

    # The bucket under `key` refilling at `rate` up to `capacity`
    # (`rate: "100/minute"` alone: capacity 100).
    def bucket(key, rate:, capacity: nil) = Bucket.new(self, key, rate, capacity)

    # Several limits on one key, checked together (all or nothing):
    # `limiter.limits("api:alice", "10/second;1000/day")`.
    def limits(key, limits) = BucketGroup.new(self, key, limits)

    # TB.MCONSUME: all or nothing across [bucket, n] pairs whose keys share
    # a hash tag. With `max_wait` (seconds) or `reserve: true` it reserves:
    # every bucket goes into debt if all will have refilled by then, and
    # `retry_after` says how long to wait before proceeding. `atmost`: the
    # parts asking for the largest n share one grant, at least `chunk`.
    def consume_many(parts, max_wait: nil, reserve: nil, atmost: false, chunk: nil)
      parts = parts.to_a
      use = reserve.nil? ? !max_wait.nil? : reserve
      raise ArgumentError, "atmost cannot be combined with a reservation (max_wait or reserve: true)" if atmost && use
      return MultiResult.from_reply(execute(Calls.mconsume(parts, nil, atmost: atmost, chunk: chunk)), atmost: atmost) unless use

      reserve_target(Many.new(parts), max_wait && Protocol.wait_ms(max_wait))[0]
    end

    # Takes every [bucket, n] at once, waiting up to `timeout` seconds
    # (default: as long as the server lets a reservation reach): one
    # reservation, one sleep on the client. Raises RateLimited when that is
    # not enough.
    #
    # With `flow:` (a String of 1 to 128 bytes: a tenant, a priority class)
    # and `weight:` (1 to 1,000,000, default 1) the call waits on the
    # server instead, in the queue of the bucket that makes it wait, and
    # takes nothing until granted: while several flows wait, grants go to
    # them in proportion to their weights (fair share; see #wait_in_flow).
    # On the Lua fallback the flow is ignored (it reserves as without).
    def acquire_many(parts, timeout: nil, flow: nil, weight: nil)
      target = Many.new(parts.to_a)
      in_flow(target, timeout, Protocol.flow_args(flow, weight)) { acquire_target(target, timeout) }
    end

    # One all-or-nothing TB.MCONSUME whose parts `ttl` names (index from 0:
    # TTL in seconds) are leased. A leased part of a bucket with rate 0 is
    # an in-flight slot; of a refilling bucket, a token estimate (leased
    # with KEEP where the server supports it). Denials are tried again,
    # backing off, until `timeout` seconds (nil: until granted or never
    # possible); then RateLimited.
    #
    # With a block, runs it with the Lease and settles on the way out: on
    # a normal exit slots are released and estimates settled to the use
    # reported (`lease.used[part] = n`), or released; when the block raises,
    # estimates stay charged (settled at the estimate, or the use reported)
    # and slots stay held until their TTL (the call may still be running),
    # unless the exception is a NotSent (or has one as its cause), or one of
    # the `not_sent` classes: then everything is given back. Without a
    # block, returns the Lease (call finish, failed or give_back).
    #
    # With `flow:` and `weight:` (as for #acquire_many) the call waits on
    # the server, in its flow's queue, instead of polling (on the Lua
    # fallback the flow is ignored and the call polls).
    def lease_many(parts, ttl:, timeout: nil, not_sent: [], flow: nil, weight: nil, &block)
      lease_within(parts, ttl, timeout, timeout, not_sent, Protocol.flow_args(flow, weight), &block)
    end

    # @private #lease_many with the wait in the flow's queue (`wait`) and
    # the polling without one (`poll_for`) timed apart: the Sidekiq
    # middleware waits in the queue but never polls.
    def lease_within(parts, ttl, wait, poll_for, not_sent, flow, &block)
      parts = parts.to_a
      ttl_ms = ttl.to_h { |j, t| [Integer(j), Protocol.lease_ttl_ms(t)] }
      target = Leases.new(parts, ttl_ms.to_h { |j, ms| [j, [ms, estimate_part?(parts[j][0])]] })
      result = in_flow(target, wait, flow) do
        call = target.call
        poll(target.name, poll_for) { target.result(execute(call)) }
      end
      Lease.new(self, parts, result.lease_ids, result, not_sent).run(&block)
    end

    # Runs one command on the module or through the Lua fallback and
    # returns the raw reply.
    def execute(call)
      if @backend != :lua
        begin
          reply = raw(*call.module_args)
          @backend = :module
          return reply
        rescue StandardError => e
          # "module" was forced, or proved by an earlier reply.
          raise if @backend == :module || !Protocol.unknown_command?(e)

          @backend = :lua
        end
      end
      script(call)
    end

    # A command on the client, whatever its kind.
    def raw(*args)
      with_client { |c| c.call(*args) }
    end

    # A command that the server may hold up to `seconds` (BLOCK): the read
    # timeout is extended by that much, as the client does for BLPOP.
    def raw_blocking(seconds, *args)
      with_client do |c|
        if c.respond_to?(:blocking_call) # RedisClient
          c.blocking_call(seconds + 1, *args)
        elsif c.respond_to?(:send_blocking_command, true) # redis-rb
          c.__send__(:send_blocking_command, args, seconds + 1)
        else
          c.call(*args)
        end
      end
    end

    # -- internals shared by Bucket, BucketGroup and Lease -----------------

    # @private A reply came from `backend` (a call made outside #execute).
    def proved(backend)
      @backend ||= backend
    end

    # @private The longest wait to reach for (ms): the caller's, within
    # the server's known limit.
    def reach_ms(ms)
      limit = @max_wait_ms.nil? ? Protocol::DEFAULT_MAX_WAIT_MS : [Protocol::DEFAULT_MAX_WAIT_MS, @max_wait_ms].min
      want = ms.nil? ? limit : ms
      @max_wait_ms.nil? ? want : [want, @max_wait_ms].min
    end

    # @private Runs the block with the wait asked for (nil: as long as the
    # server allows), no longer than the server accepts: when it refuses
    # ("ERR wait exceeds tb.max-wait-ms (N)"), N is remembered and the call
    # made again with N (halved until accepted on servers that do not say N).
    # Returns [reply, wait used].
    def with_wait(ms)
      want = reach_ms(ms)
      32.times do
        return [yield(want), want]
      rescue StandardError => e
        refused, limit = Protocol.max_wait_error(e)
        raise if !refused || want.zero?

        limit = want / 2 if limit.nil?
        raise if limit >= want

        @max_wait_ms = limit
        want = limit
      end
      raise Error, "unreachable: the wait halves to 0 within 32 tries"
    end

    # @private [result, wait used] of a reservation of `target`.
    def reserve_target(target, ms)
      reply, used = with_wait(ms) { |m| execute(target.call(m)) }
      [target.result(reply), used]
    end

    # @private Reserve, then sleep the reserved wait on the client; an
    # exception during the sleep gives the reservation back first.
    def acquire_target(target, timeout)
      deadline = timeout && now + timeout
      loop do
        left = deadline && Protocol.wait_ms([0.0, deadline - now].max)
        r, used = reserve_target(target, left)
        if r.allowed?
          sleep_or_give_back(r.retry_after, target.taken(r)) if r.retry_after_ms.positive?
          return r
        end
        raise RateLimited.new(target.name, r) if r.never? || left.nil? || r.retry_after_ms > left

        sleep([r.retry_after_ms - used, 1].max / 1000.0)
      end
    end

    # @private Sleeps until a reservation is due; if the sleep ends in an
    # exception (an interrupt, a Timeout), gives the tokens back first.
    def sleep_or_give_back(seconds, taken)
      sleep(seconds) if seconds.positive?
    rescue Exception # rubocop:disable Lint/RescueException -- given back, then re-raised
      undo(taken)
      raise
    end

    # @private Gives back what a call took, best effort (it runs while
    # another exception is on its way: a failure is warned about).
    def undo(taken)
      taken.each do |bucket, n|
        next unless n.positive?

        begin
          execute(Calls.refund(bucket, n))
        rescue StandardError => e
          warn "tb_limiter: could not refund #{n} token(s) to #{bucket.key.inspect}: #{e.message}"
        end
      end
    end

    # @private With a flow (Protocol.flow_args, not empty) and the module
    # (or no backend known yet), #wait_in_flow; otherwise, or when the first
    # call finds no module, the block (the call without a flow: the Lua
    # fallback cannot hold a reply, so it ignores the flow).
    def in_flow(target, timeout, flow)
      if !flow.empty? && @backend != :lua
        begin
          return wait_in_flow(target, timeout, flow)
        rescue StandardError => e
          raise unless @backend.nil? && Protocol.unknown_command?(e)

          @backend = :lua
        end
      end
      yield
    end

    # @private Waits on the server in the flow's queue (`BLOCK ms FLOW name
    # [WEIGHT w]`) until granted, for at most `timeout` seconds (nil: as
    # long as the server lets one wait reach, tb.max-wait-ms); then raises
    # RateLimited. A timeout longer than the server's longest wait is
    # waited in several calls. The connection is held meanwhile, its read
    # timeout extended by the wait (#raw_blocking). A call the server
    # answers before its wait ran out (past its bounds on waiting clients)
    # pauses until the tokens are due, then asks again.
    def wait_in_flow(target, timeout, flow)
      start = now
      budget = timeout.nil? ? reach_ms(nil) : Protocol.wait_ms(timeout) # ms from start
      loop do
        asked = now
        spent = ((asked - start) * 1000).floor
        reply, used = with_wait([budget - spent, 0].max) do |m|
          raw_blocking(m / 1000.0, *target.block_call(m, flow).module_args)
        end
        proved(:module)
        r = target.result(reply)
        if r.allowed?
          # Answered as RESERVE would (a plain BLOCK past the server's
          # bounds): the tokens are taken, due after retry_after.
          sleep_or_give_back(r.retry_after, target.taken(r)) if r.retry_after_ms.positive?
          return r
        end
        budget = [budget, spent + used].min if timeout.nil? # the server's longest wait, once known
        rest = budget / 1000.0 - (now - start)
        raise RateLimited.new(target.name, r) if r.never? || rest < 0.001

        early = used / 1000.0 - (now - asked)
        sleep([[r.retry_after, rest, early].min, 0.001].max) if early > 0.001
      end
    end

    # @private Polls `yield` (a lease attempt) until allowed, backing off.
    def poll(name, timeout)
      deadline = timeout && now + timeout
      pause = LEASE_POLL[0]
      loop do
        r = yield
        return r if r.allowed?

        left = deadline && deadline - now
        raise RateLimited.new(name, r) if r.never? || (left && left <= 0)

        wait = [pause, r.retry_after_ms / 1000.0].min
        sleep([0.001, left ? [wait, left].min : wait].max)
        pause = [pause * 2, LEASE_POLL[1]].min
      end
    end

    # @private A leased part of a refilling bucket is a token estimate (its
    # expiry keeps it used); of a rate-0 bucket an in-flight slot.
    def estimate_part?(bucket) = bucket.rate != "0"

    private

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    def with_client(&block)
      c = @client
      return c.with(&block) if c.respond_to?(:with) && !c.respond_to?(:call)

      yield c
    end

    def script(call)
      head = call.script_args
      begin
        return raw("EVALSHA", Protocol::SCRIPT_SHA, *head)
      rescue StandardError => e
        raise unless Protocol.noscript?(e)
      end
      begin
        # Runs the script and caches it on the server in one round trip.
        return raw("EVAL", Protocol::SCRIPT, *head)
      rescue StandardError => e
        raise unless Protocol.noperm?(e)
      end
      # A user allowed EVALSHA and SCRIPT LOAD, but not EVAL.
      raw("SCRIPT", "LOAD", Protocol::SCRIPT)
      raw("EVALSHA", Protocol::SCRIPT_SHA, *head)
    end
  end

  # @private TB.CONSUME on one bucket, as a reservation target (`call`) or
  # a call waiting in a flow's queue (`block_call`).
  Single = Struct.new(:bucket, :n) do
    def call(ms) = Calls.consume(bucket, n, reserve: ms)
    def block_call(ms, flow) = Calls.consume(bucket, n, block: ms, flow: flow)
    def result(reply) = Result.from_reply(reply)
    def taken(r) = r.allowed? ? [[bucket, r.granted]] : []
    def name = bucket.key.to_s
  end

  # @private TB.MCONSUME on several buckets, all or nothing.
  Many = Struct.new(:parts) do
    def call(ms) = Calls.mconsume(parts, ms)
    def block_call(ms, flow) = Calls.mconsume(parts, nil, block: ms, flow: flow)
    def result(reply) = MultiResult.from_reply(reply)
    def taken(r) = r.allowed? ? parts : []
    def name = parts.map { _1[0].key }.join(",")
  end

  # @private TB.MCONSUME with leased parts ({part => [ttl_ms, keep]}).
  Leases = Struct.new(:parts, :leases) do
    def call = Calls.mconsume(parts, nil, leases: leases)
    def block_call(ms, flow) = Calls.mconsume(parts, nil, leases: leases, block: ms, flow: flow)
    def result(reply) = MultiResult.from_reply(reply, leases: true)
    # A lease is never answered as a reservation: nothing to give back.
    def taken(_r) = []
    def name = parts.map { _1[0].key }.join(",")
  end
end
