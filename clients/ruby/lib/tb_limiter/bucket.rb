# frozen_string_literal: true

module TbLimiter
  # One bucket: `limiter.bucket("llm:openai", rate: "0.5", capacity: 1)`.
  # Every request carries the limits, so changing them here changes them
  # for the key.
  class Bucket
    attr_reader :limiter, :key, :rate, :capacity

    def initialize(limiter, key, rate, capacity = nil)
      capacity ||= Rates.implied_capacity(rate)
      raise ArgumentError, "capacity is required unless the rate is written like '100/minute'" if capacity.nil?
      raise TypeError, "capacity must be an Integer" unless capacity.is_a?(Integer)

      @limiter = limiter
      @key = key
      @rate = Rates.rate_arg(rate)
      @capacity = capacity
    end

    def inspect = "#<TbLimiter::Bucket #{key.inspect} rate=#{rate.inspect} capacity=#{capacity}>"

    # Takes `n` tokens now or none (`atmost`: as many as there are, at
    # least `chunk`). `n = 0` is a peek.
    def consume(n = 1, atmost: false, chunk: nil)
      Result.from_reply(limiter.execute(Calls.consume(self, n, atmost: atmost, chunk: chunk)))
    end

    # Whether one request would be served now, changing nothing.
    def peek = consume(0)

    # RESERVE: if the tokens will be there within `max_wait` seconds
    # (default and most: what the server accepts, 60 s or its
    # tb.max-wait-ms), takes them now (into debt) and returns allowed with
    # the wait in retry_after: first come, first served across the fleet.
    # A denial also has retry_after (when the tokens will be there).
    def reserve(n = 1, max_wait: nil)
      limiter.reserve_target(Single.new(self, n), max_wait && Protocol.wait_ms(max_wait))[0]
    end

    # Waits until `n` tokens are taken, at most `timeout` seconds: reserves,
    # then sleeps on the client (an exception during the sleep gives the
    # tokens back). Raises RateLimited at once when the wait would be longer
    # than `timeout` or the request can never succeed.
    #
    # With `flow:` (a String of 1 to 128 bytes: a tenant, a priority class)
    # and `weight:` (an Integer from 1 to 1,000,000, default 1) it waits on
    # the server instead, in the bucket's queue, taking nothing until
    # granted: while several flows wait, grants go to them in proportion to
    # their weights, first come first served within a flow (fair share).
    # The connection is held meanwhile (see #block). Raises RateLimited when
    # `timeout` runs out. On the Lua fallback, which cannot hold a reply,
    # the flow is ignored: it reserves as without one.
    def acquire(n = 1, timeout: nil, flow: nil, weight: nil)
      target = Single.new(self, n)
      limiter.in_flow(target, timeout, Protocol.flow_args(flow, weight)) { limiter.acquire_target(target, timeout) }
    end

    # Waits on the server (BLOCK): one round trip, woken at the exact time,
    # first come first served; the connection is held meanwhile (pass a
    # ConnectionPool as the limiter's client when other threads share it).
    # On the Lua fallback, which cannot hold a reply, it is #acquire. With
    # `flow:` and `weight:` it is #acquire with them.
    def block(n = 1, timeout: nil, flow: nil, weight: nil)
      return acquire(n, timeout: timeout, flow: flow, weight: weight) unless Protocol.flow_args(flow, weight).empty?
      return acquire(n, timeout: timeout) if limiter.backend == :lua

      target = Single.new(self, n)
      ms = timeout && Protocol.wait_ms(timeout)
      reply, = limiter.with_wait(ms) do |m|
        limiter.raw_blocking(m / 1000.0, *Calls.consume(self, n, block: m).module_args)
      end
      limiter.proved(:module)
      r = Result.from_reply(reply)
      if r.allowed?
        # The server's tb.max-blocked was reached: it answered as RESERVE.
        limiter.sleep_or_give_back(r.retry_after, target.taken(r)) if r.retry_after_ms.positive?
        return r
      end
      raise RateLimited.new(key.to_s, r)
    rescue StandardError => e
      raise unless limiter.backend.nil? && Protocol.unknown_command?(e)

      acquire(n, timeout: timeout) # the first call found no module: the fallback decides
    end

    # Gives back `n` tokens (never above capacity). Returns the whole
    # tokens now in the bucket, or nil for a missing key.
    def refund(n) = limiter.execute(Calls.refund(self, n))&.then { Integer(_1) }

    # The bucket as of now (BucketInfo), or nil for a missing key.
    def info = limiter.execute(Calls.info(self))&.then { BucketInfo.from_reply(_1) }

    # A lease of `n` tokens (a slot of a concurrency limit: a bucket with
    # rate 0; or a token estimate) for `ttl` seconds; see Limiter#lease_many
    # for the block form and its failure semantics.
    # With `flow:` and `weight:` it waits in the bucket's queue on the
    # server instead of polling (see #acquire).
    def lease(n = 1, ttl:, timeout: nil, not_sent: [], flow: nil, weight: nil, &block)
      limiter.lease_many([[self, n]], ttl: { 0 => ttl }, timeout: timeout, not_sent: not_sent,
                                      flow: flow, weight: weight, &block)
    end

    # TB.RELEASE: the tokens that actually went back, or nil when the lease
    # is not held (released already, expired): a retried release does nothing.
    def release(lease_id) = limiter.execute(Calls.release(self, lease_id))&.then { Integer(_1) }

    # TB.RELEASE ... USED: settles a lease to the `used` tokens; the rest
    # comes back, an overrun is charged (negative reply). nil when not held.
    def settle(lease_id, used) = limiter.execute(Calls.release(self, lease_id, used))&.then { Integer(_1) }
  end

  # Several limits on one key ("10/second;1000/day"), one bucket each
  # ("{key}:10/1s", ...: one cluster slot), checked together with
  # TB.MCONSUME: a request is served only if every limit has room.
  class BucketGroup
    attr_reader :limiter, :limits, :buckets

    def initialize(limiter, key, limits)
      @limiter = limiter
      @limits = limits.is_a?(String) ? Rates.parse_limits(limits) : limits.to_a
      raise ArgumentError, "no limits given" if @limits.empty?

      @buckets = @limits.map { |l| Bucket.new(limiter, BucketGroup.group_key(key, l), l.rate, l.amount) }
    end

    # "rl:{alice}:10/1s" for a key with a hash tag, else
    # "rl:alice:{rl:alice}:10/1s": one slot, and the key given as prefix.
    def self.group_key(key, limit)
      start = key.index("{")
      tagged = start && (close = key.index("}", start + 1)) && close > start + 1
      tagged ? "#{key}:#{limit.key_suffix}" : "#{key}:{#{key}}:#{limit.key_suffix}"
    end

    def consume(n = 1) = limiter.consume_many(parts(n))
    def peek = consume(0)
    def reserve(n = 1, max_wait: nil) = limiter.consume_many(parts(n), max_wait: max_wait, reserve: true)
    def acquire(n = 1, timeout: nil, flow: nil, weight: nil)
      limiter.acquire_many(parts(n), timeout: timeout, flow: flow, weight: weight)
    end
    def refund(n) = buckets.each { _1.refund(n) }

    private

    def parts(n) = buckets.map { [_1, n] }
  end
end
