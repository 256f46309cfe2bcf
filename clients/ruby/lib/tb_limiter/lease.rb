# frozen_string_literal: true

module TbLimiter
  # Leases granted by one TB.CONSUME / TB.MCONSUME with LEASE parts (see
  # Limiter#lease_many and Bucket#lease). `ids[part]` is a part's lease id
  # (0 for a part taken, not leased); set `used[part]` (or `used =` for a
  # single bucket) to settle an estimate to what the call really used.
  #
  # Exactly one of #finish, #failed and #give_back takes effect; later calls
  # do nothing.
  class Lease
    attr_reader :parts, :ids, :result, :used

    def initialize(limiter, parts, ids, result, not_sent = [])
      @limiter = limiter
      @parts = parts
      @ids = ids
      @result = result
      @not_sent = Array(not_sent)
      @used = {}
      @done = false
    end

    # The first leased part's id (the one of a single-bucket lease).
    def id = ids.find(&:positive?) || 0

    # The use to settle a single-bucket lease (or its first leased part) to.
    def used=(n)
      @used[ids.index(id) || 0] = n
    end

    def done? = @done

    # The call ended normally: every leased part is released, settled to
    # `used[part]` when set. Returns the replies (tokens that went back,
    # negative for an overrun charged; nil for a lease no longer held).
    def finish
      settle_each(false) { |j, _b, _n| [true, used[j]] }
    end

    # The call failed after it may have reached the provider: an estimate
    # stays charged (settled at `used[part]` if set, else at the estimate);
    # an in-flight slot stays held until its TTL, since the call may still
    # be running.
    def failed(quiet: false)
      settle_each(quiet) { |j, b, n| @limiter.estimate_part?(b) ? [true, used[j] || n] : [false, nil] }
    end

    # The request never left (connection refused, validation error):
    # everything goes back, the leases released whole and the parts taken
    # without a lease refunded.
    def give_back(quiet: false)
      return [] if @done

      @done = true
      parts.each_with_index.map do |(b, n), j|
        best_effort(b, quiet) { ids[j].to_i.positive? ? b.release(ids[j]) : (n.positive? ? b.refund(n) : nil) }
      end
    end

    # Whether `error` (or one of its causes) means "not sent": a NotSent,
    # or one of the classes given as `not_sent:`.
    def not_sent?(error)
      seen = 0
      while error && seen < 16
        return true if error.is_a?(NotSent) || @not_sent.any? { error.is_a?(_1) }

        error = error.cause
        seen += 1
      end
      false
    end

    # @private The block form: runs it, then settles as the contract says.
    def run
      return self unless block_given?

      begin
        value = yield self
      rescue Exception => e # rubocop:disable Lint/RescueException -- settled, then re-raised
        not_sent?(e) ? give_back(quiet: true) : failed(quiet: true)
        raise
      end
      finish
      value
    end

    private

    def settle_each(quiet)
      return [] if @done

      @done = true
      parts.each_with_index.filter_map do |(b, n), j|
        next unless ids[j].to_i.positive?

        act, use = yield j, b, n
        next unless act

        best_effort(b, quiet) { use.nil? ? b.release(ids[j]) : b.settle(ids[j], use) }
      end
    end

    # Quiet while another exception is on its way (that one goes on; this
    # failure is warned about); else the caller sees the failure.
    def best_effort(bucket, quiet)
      yield
    rescue StandardError => e
      raise unless quiet

      warn "tb_limiter: could not settle a lease on #{bucket.key.inspect}: #{e.message}"
    end
  end
end
