# frozen_string_literal: true

require "bigdecimal"

module TbLimiter
  # Every error the gem raises on its own (the server's errors come as the
  # Redis client's own error classes).
  class Error < StandardError; end

  # The tokens (or the lease) could not be had within the wait asked for.
  # `result` is the reply that said so; `retry_after_ms` is its wait (-1:
  # never possible, e.g. more tokens than the capacity).
  class RateLimited < Error
    attr_reader :key, :result

    def initialize(key, result)
      @key = key
      @result = result
      why = result.never? ? "can never be satisfied" : "needs #{result.retry_after_ms} ms"
      super("rate limited on #{key.inspect}: #{why}")
    end

    def retry_after_ms = result.retry_after_ms

    # Seconds to wait before trying again (Float::INFINITY for never).
    def retry_after = result.retry_after
  end

  # Raised (or wrapped, as an exception's `cause`) by a leased block for a
  # failure known to happen before the request left (connection refused, a
  # validation error): the lease gives everything back instead of keeping
  # the estimate charged and the in-flight slot held.
  class NotSent < Error; end

  # Milliseconds to seconds; -1 (never) becomes infinity.
  def self.seconds(ms) = ms.negative? ? Float::INFINITY : ms / 1000.0

  # The reply of TB.CONSUME: [allowed, remaining, retry_after_ms,
  # reset_after_ms, granted] (and the lease id with LEASE: 0 when denied).
  Result = Struct.new(:allowed, :remaining, :retry_after_ms, :reset_after_ms, :granted, :lease_id) do
    def self.from_reply(reply)
      v = reply.map { Integer(_1) }
      new(v[0] == 1, v[1], v[2], v[3], v[4], v[5])
    end

    def allowed? = allowed
    # Seconds to wait before proceeding (or retrying); infinity for never.
    def retry_after = TbLimiter.seconds(retry_after_ms)
    def reset_after = TbLimiter.seconds(reset_after_ms)
    # The request can never succeed (n > capacity, or rate 0).
    def never? = retry_after_ms.negative?
    def lease_ids = lease_id ? [lease_id] : []
    # The reply as the server sent it.
    def reply = [allowed ? 1 : 0, remaining, retry_after_ms, reset_after_ms, granted, *lease_id]
  end

  # The reply of TB.MCONSUME: [allowed, retry_after_ms, remaining...], with
  # ATMOST the grant, with LEASE parts every part's lease id.
  MultiResult = Struct.new(:allowed, :retry_after_ms, :remaining, :granted, :lease_ids) do
    def self.from_reply(reply, atmost: false, leases: false)
      v = reply.map { Integer(_1) }
      return new(v[0] == 1, v[1], v[2...-1], v[-1], []) if atmost

      if leases
        k = (v.size - 2) / 2
        return new(v[0] == 1, v[1], v[2, k], nil, v[(2 + k)..])
      end
      new(v[0] == 1, v[1], v[2..], nil, [])
    end

    def allowed? = allowed
    def retry_after = TbLimiter.seconds(retry_after_ms)
    def never? = retry_after_ms.negative?
    def reply = [allowed ? 1 : 0, retry_after_ms, *remaining, *granted, *lease_ids]
  end

  # A flow waiting on a bucket (BucketInfo#flows): its name, its weight and
  # how many of its calls wait.
  FlowInfo = Struct.new(:name, :weight, :waiting)

  # The reply of TB.INFO: the bucket as of now (read-only). `waiting`: the
  # calls waiting in its queue on the server (0 when none); `flows`: the
  # FlowInfo of each flow waiting, in the order they are served next (the
  # default flow of calls that wait without one is named "").
  BucketInfo = Struct.new(:tokens, :capacity, :rate, :updated_at_ms, :reset_after_ms, :ttl_ms, :waiting, :flows) do
    # From the flat field/value array (or a Hash, as RESP3 clients give).
    def self.from_reply(reply)
      pairs = reply.is_a?(Hash) ? reply.to_a : reply.each_slice(2).to_a
      f = pairs.to_h { |k, v| [k.to_s, v.is_a?(Array) ? v : v.to_s] }
      flows = f.fetch("waiting_flows", []).each_slice(3).map { |n, w, c| FlowInfo.new(n.to_s, Integer(w), Integer(c)) }
      new(BigDecimal(f.fetch("tokens")), Integer(f.fetch("capacity")), BigDecimal(f.fetch("rate")),
          Integer(f.fetch("updated_at_ms")), Integer(f.fetch("reset_after_ms")), Integer(f.fetch("ttl_ms")),
          Integer(f.fetch("waiting", "0")), flows)
    end
  end
end
