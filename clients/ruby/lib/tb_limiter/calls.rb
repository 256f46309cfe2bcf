# frozen_string_literal: true

module TbLimiter
  # The command of each operation, spelled once (Protocol::Call: the module
  # form and the Lua fallback's).
  module Calls
    module_function

    def limits(bucket) = [bucket.rate, bucket.capacity.to_s]

    # TB.CONSUME; `reserve` / `block`: the wait in ms; `lease`: [ttl_ms,
    # keep]; `flow`: Protocol.flow_args (with `block` only).
    def consume(bucket, n, reserve: nil, block: nil, atmost: false, chunk: nil, lease: nil, flow: [])
      args = [*limits(bucket), Protocol.amount(n)]
      args += ["RESERVE", reserve.to_s] if reserve
      args += ["BLOCK", block.to_s] if block
      args += lease_args(*lease) if lease
      args += block_flow(block, flow)
      args += atmost_args(atmost, chunk)
      Protocol::Call.new("TB.CONSUME", [bucket.key], args)
    end

    def refund(bucket, n) = Protocol::Call.new("TB.REFUND", [bucket.key], [Protocol.amount(n)])

    def info(bucket) = Protocol::Call.new("TB.INFO", [bucket.key], [])

    # TB.RELEASE, settled to `used` tokens when given.
    def release(bucket, lease_id, used = nil)
      extra = used.nil? ? [] : ["USED", Protocol.amount(used, "used")]
      Protocol::Call.new("TB.RELEASE", [bucket.key], [Integer(lease_id).to_s, *extra])
    end

    # TB.MCONSUME over [bucket, n] pairs, with RESERVE ms when given, or
    # ATMOST [MIN chunk], or BLOCK ms [FLOW name [WEIGHT w]] (`block`, and
    # `flow` from Protocol.flow_args); `leases`: {part index from 0 =>
    # [ttl_ms, keep]}.
    def mconsume(parts, ms, leases: {}, atmost: false, chunk: nil, block: nil, flow: [])
      raise ArgumentError, "consume_many needs at least one [bucket, n] pair" if parts.empty?

      args = parts.flat_map { |b, n| [*limits(b), Protocol.amount(n)] }
      leases.sort.each do |part, (ttl_ms, keep)|
        raise ArgumentError, "no part #{part} to lease among #{parts.size}" unless part.between?(0, parts.size - 1)

        args += ["LEASE", (part + 1).to_s, *lease_args(ttl_ms, keep)[1..]]
      end
      args += ["RESERVE", ms.to_s] if ms
      args += ["BLOCK", block.to_s] if block
      args += block_flow(block, flow)
      args += atmost_args(atmost, chunk)
      Protocol::Call.new("TB.MCONSUME", parts.map { _1[0].key }, args)
    end

    # The flow of a call that waits on the server: FLOW needs BLOCK.
    def block_flow(block, flow)
      raise ArgumentError, "a flow goes with a wait on the server (BLOCK)" if !flow.empty? && block.nil?

      flow
    end

    def lease_args(ttl_ms, keep = false)
      ["LEASE", ttl_ms.to_s, *("KEEP" if keep)]
    end

    # ATMOST [MIN chunk], or nothing; a chunk needs atmost.
    def atmost_args(atmost, chunk)
      raise ArgumentError, "chunk is the smallest grant of atmost: true" if chunk && !atmost
      return [] unless atmost

      chunk.nil? ? ["ATMOST"] : ["ATMOST", "MIN", Protocol.amount(chunk, "chunk")]
    end
  end
end
