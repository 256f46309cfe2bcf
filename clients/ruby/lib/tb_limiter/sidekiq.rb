# frozen_string_literal: true

require "sidekiq"
require_relative "../tb_limiter"

module TbLimiter
  # Sidekiq jobs that keep a fleet-wide limit. A limited job is never run
  # without its tokens and never slept on for long: when its turn is not
  # now, it is re-scheduled (as `perform_in`) for its turn and the worker
  # thread moves on.
  #
  #   class CallApi
  #     include Sidekiq::Job
  #     include TbLimiter::Sidekiq::Limited
  #     tb_limit rate: "100/m", capacity: 10, key: ->(account_id, *) { "acct:#{account_id}" }
  #     def perform(account_id, payload) = ...
  #   end
  #
  #   Sidekiq.configure_server do |config|
  #     config.server_middleware { |chain| chain.add TbLimiter::Sidekiq::Middleware }
  #   end
  #
  # A token-bucket limit (tb_limit) reserves: TB.CONSUME ... RESERVE, first
  # come first served across every process.
  # * due now: the job runs;
  # * due later (the bucket goes into debt for it): the job is pushed again
  #   with the same jid, scheduled `lead` seconds before its turn, carrying
  #   its turn in the payload ("tb_turn"); when Sidekiq's scheduler brings
  #   it back it sleeps the rest of the lead and runs at its turn;
  # * further away than a reservation reaches (a backlog deeper than the
  #   server's tb.max-wait-ms): nothing is taken and the job is scheduled
  #   to ask again when its tokens are within reach (not sooner than half
  #   the reach, so a deep backlog comes back in waves);
  # * never possible (more than the capacity): RateLimited, a real failure.
  # A re-scheduled job is the same job: no retry is counted, it is not
  # duplicated (the fetched copy is only in the worker's memory: pushing the
  # new one and returning hands the job over), "tb_reschedules" counts the
  # hops. A job that comes back more than `late` seconds past its turn (a
  # busy fleet, a restart) does not run late, which could bunch calls: its
  # tokens go back (TB.REFUND) and it takes a new turn.
  #
  # A leased limit (tb_lease: requests, tokens and in-flight slots in one
  # TB.MCONSUME) takes its leases now or re-schedules the job, backing off
  # (a release can come any time, so leases are polled, not reserved). The
  # job's body runs with the Lease (TbLimiter::Sidekiq.lease; report the
  # use with `tb_used(:tpm, n)`), settled on the way out with the
  # contract's failure semantics (see Limiter#lease_many).
  #
  # Fair share: `flow:` (a String, or a proc of the job hash such as
  # `->(job) { job["args"].first }` for a tenant argument; nil: no flow;
  # other values are turned into Strings) and `weight:` (an Integer, or a
  # proc of the job hash). A job with a flow does not reserve: it waits in
  # the worker thread, on the server, in its flow's queue of the bucket
  # (at most `max_wait` seconds, default the server's tb.max-wait-ms), and
  # takes nothing until granted; while jobs of several flows wait, grants go
  # to the flows in proportion to their weights, so one tenant's backlog
  # cannot starve the others. A job whose wait runs out holds nothing and is
  # re-scheduled to ask again when its tokens are due. Each waiting job
  # holds a worker thread (and a connection of the limiter's pool: give the
  # pool at least the concurrency). On the Lua fallback, which cannot hold a
  # reply, the flow is ignored: jobs reserve and re-schedule as without it.
  module Sidekiq
    # Payload fields the middleware keeps in a re-scheduled job.
    TURN = "tb_turn"
    HOPS = "tb_reschedules"
    # Longest pause between two tries of a denied lease.
    LEASE_BACKOFF = [0.1, 1.0].freeze

    class << self
      # The Limiter the middleware uses (default: one on Sidekiq's own
      # Redis pool, made on first use).
      attr_writer :limiter
      # Seconds before its turn a re-scheduled job is brought back (it
      # sleeps the rest). It must cover the lateness of Sidekiq's scheduler:
      # default 1.5 x `poll_interval_average` + 0.1 s (the longest pause of
      # its poller below 10 processes), 1.6 s when that is not set.
      attr_writer :lead

      def limiter
        @limiter ||= Limiter.new(::Sidekiq.redis_pool)
      end

      def lead
        return @lead if @lead

        avg = setting(:poll_interval_average)
        return 1.5 * avg + 0.1 if avg

        unless @warned
          @warned = true
          ::Sidekiq.logger.warn("tb_limiter: poll_interval_average is not set; Sidekiq's scheduler then polls " \
                                "about every 5 s per process and brings re-scheduled jobs back after their turn " \
                                "(they take a new one). Set it (e.g. to 1), or TbLimiter::Sidekiq.lead.")
        end
        1.6
      end

      # A Sidekiq setting: Sidekiq.options up to 6.x, the default
      # configuration from 7.
      def setting(name)
        if ::Sidekiq.respond_to?(:default_configuration)
          ::Sidekiq.default_configuration[name]
        else
          ::Sidekiq.options[name]
        end
      end

      # Per-queue defaults: every job of `queue` whose class sets no limit
      # of its own gets this one (same options as Limited.tb_limit /
      # tb_lease, given as `limit:` or `lease:`).
      def queue_limits = (@queue_limits ||= {})

      def limit_queue(queue, **options)
        queue_limits[queue.to_s] = Spec.build(options)
      end

      # Inside a leased job: its Lease.
      def lease = Thread.current[:tb_limiter_lease]

      # @private
      def lease=(value)
        Thread.current[:tb_limiter_lease] = value
      end
    end

    # A limit of a job class or queue: a bucket reservation, or leases.
    class Spec
      attr_reader :key, :n, :options, :flow, :weight

      def self.build(options)
        options = options.dup
        if options.key?(:lease)
          LeaseSpec.new(**options.delete(:lease), **options)
        else
          BucketSpec.new(**options.fetch(:limit, options).dup)
        end
      end

      # The key for a job's arguments.
      def key_for(args)
        k = @key.respond_to?(:call) ? @key.call(*args) : @key
        raise ArgumentError, "a tb_limit key must be a String, got #{k.inspect}" unless k.is_a?(String)

        k
      end

      def self.amount(n, args) = n.respond_to?(:call) ? Integer(n.call(*args)) : n

      # `FLOW name [WEIGHT w]` for a job (Protocol.flow_args), [] without a
      # flow.
      def flow_for(job)
        f = @flow.respond_to?(:call) ? @flow.call(job) : @flow
        return [] if f.nil?

        w = @weight.respond_to?(:call) ? @weight.call(job) : @weight
        Protocol.flow_args(f.is_a?(String) ? f : f.to_s, w)
      end

      private

      # Keeps the flow options, checking fixed values now (a bad one is
      # refused when the class is loaded, not at its first job).
      def fair(flow, weight)
        raise ArgumentError, "weight: goes with flow:" if flow.nil? && !weight.nil?

        @flow, @weight = flow, weight
        Protocol.flow_args(flow, weight.respond_to?(:call) ? nil : weight) if flow.is_a?(String)
      end
    end

    # tb_limit: one bucket, reserved.
    class BucketSpec < Spec
      attr_reader :rate, :capacity, :max_wait, :late

      def initialize(key:, rate:, capacity: nil, n: 1, max_wait: nil, late: nil, flow: nil, weight: nil)
        super()
        @key, @n, @rate, @capacity, @max_wait = key, n, rate, capacity, max_wait
        fair(flow, weight)
        per_second = Rates.per_second(Rates.rate_arg(rate))
        # Late by less than a quarter of a token's time: a call never lands
        # in another token's window.
        @late = late || (per_second.positive? ? [0.05, 0.25 / per_second].min.to_f : 0.05)
      end

      def bucket(limiter, args) = limiter.bucket(key_for(args), rate: rate, capacity: capacity)
    end

    # tb_lease: parts taken or leased together; `parts` maps a name to
    # {rate:, capacity:, n:, lease: true/false} (a part without a rate is an
    # in-flight slot: rate 0, leased).
    class LeaseSpec < Spec
      attr_reader :parts, :ttl, :not_sent, :max_wait

      def initialize(key:, parts:, ttl:, not_sent: [], flow: nil, weight: nil, max_wait: nil)
        super()
        @key, @ttl, @not_sent, @max_wait = key, ttl, not_sent, max_wait
        fair(flow, weight)
        @parts = parts.map do |name, o|
          slot = !o.key?(:rate)
          { name: name.to_sym, rate: o.fetch(:rate, 0), capacity: o[:capacity], n: o.fetch(:n, 1),
            lease: o.fetch(:lease, slot || o.key?(:n)) }
        end
      end

      # Part `name` of key "llm:{acct}" is the bucket "llm:{acct}:name"
      # (one hash tag, one cluster slot).
      def items(limiter, args)
        base = key_for(args)
        parts.map do |p|
          [limiter.bucket("#{base}:#{p[:name]}", rate: p[:rate], capacity: p[:capacity]), Spec.amount(p[:n], args)]
        end
      end

      def ttl_map = parts.each_with_index.select { |p, _| p[:lease] }.to_h { |_, j| [j, ttl] }
      def index(name) = parts.index { _1[:name] == name.to_sym }
    end

    # Include in a Sidekiq job class for the class-level `tb_limit` /
    # `tb_lease`, and `tb_used` inside `perform`.
    module Limited
      def self.included(base) = base.extend(ClassMethods)

      module ClassMethods
        # A token bucket for this job class: `rate:`, `capacity:`, `key:` (a
        # String or a lambda of the job's arguments), `n:` (tokens per job,
        # or a lambda), `max_wait:` (how far ahead to reserve, or how long a
        # job with a flow waits), `late:`, `flow:` and `weight:` (fair
        # share: a String or Integer, or a proc of the job hash).
        def tb_limit(**options)
          @tb_spec = BucketSpec.new(**options)
        end

        # Leases for this job class: `key:` (a lambda of the job's
        # arguments; give it a hash tag, e.g. "llm:{#{account}}"),
        # `parts:` ({rpm: {rate: "60/m", capacity: 60}, tpm: {rate:
        # "40000/m", capacity: 40000, n: ->(*args) { estimate }},
        # inflight: {capacity: 4}}), `ttl:` (seconds a lease lives if its
        # process dies), `not_sent:` (exception classes that mean the call
        # never left), `flow:`, `weight:` and `max_wait:` (fair share, as for
        # tb_limit).
        def tb_lease(**options)
          @tb_spec = LeaseSpec.new(**options)
        end

        def tb_spec = @tb_spec || (superclass.respond_to?(:tb_spec) ? superclass.tb_spec : nil)
      end

      # Reports the tokens a leased part really used (settled after the job).
      def tb_used(part, n)
        lease = Sidekiq.lease or raise Error, "tb_used outside a leased job"
        spec = self.class.tb_spec
        lease.used[spec.index(part) || raise(ArgumentError, "no part #{part.inspect}")] = n
      end
    end

    # The server middleware that applies the limits (see the module's doc).
    class Middleware
      include ::Sidekiq::ServerMiddleware if defined?(::Sidekiq::ServerMiddleware)

      def call(worker, job, queue, &block)
        spec = (worker.class.respond_to?(:tb_spec) && worker.class.tb_spec) || Sidekiq.queue_limits[queue.to_s]
        return yield if spec.nil?

        args = job["args"] || []
        if spec.is_a?(LeaseSpec)
          leased(spec, job, args, &block)
        else
          reserved(spec, job, args, &block)
        end
      end

      private

      def limiter = Sidekiq.limiter
      def now = Time.now.to_f

      def reserved(spec, job, args, &block)
        bucket = spec.bucket(limiter, args)
        n = Spec.amount(spec.n, args)
        turn = job[TURN]
        return if turn.nil? && in_flow(spec, job, bucket, n, &block)

        held = !turn.nil? # a re-scheduled job holds its turn's tokens
        loop do
          if turn.nil?
            turn = reserve(spec, bucket, n, job) or return
            held = false
          end
          wait = turn - now
          begin
            sleep(wait) if wait.positive?
          rescue Exception # rubocop:disable Lint/RescueException -- e.g. Sidekiq::Shutdown
            # A job re-scheduled with its turn comes back with it (Sidekiq
            # pushes the fetched payload back on shutdown): it keeps its
            # tokens. A first reservation is given back.
            limiter.undo([[bucket, n]]) unless held
            raise
          end
          return yield if now <= turn + spec.late

          # Missed the turn: give its tokens back, take a new one.
          limiter.undo([[bucket, n]])
          turn = nil
        end
      end

      # A job with a flow, on the module: waits in its flow's queue, then
      # runs, or is re-scheduled holding nothing when its wait runs out.
      # False (nothing done) without a flow or on the Lua fallback.
      def in_flow(spec, job, bucket, n)
        flow = spec.flow_for(job)
        return false if flow.empty?

        begin
          return false unless limiter.in_flow(Single.new(bucket, n), spec.max_wait, flow) { nil }
        rescue RateLimited => e
          raise if e.result.never?

          reschedule(job, now + [e.retry_after, 0.001].max, nil)
          return true
        end
        yield
        true
      end

      # A turn (wall-clock seconds) due within the lead, or nil after the
      # job was re-scheduled.
      def reserve(spec, bucket, n, job)
        r = bucket.reserve(n, max_wait: spec.max_wait)
        lead = Sidekiq.lead
        if r.allowed?
          turn = now + r.retry_after
          return turn if r.retry_after <= lead

          reschedule(job, turn - lead, turn)
          return nil
        end
        raise RateLimited.new(bucket.key, r) if r.never?

        reach = limiter.reach_ms(spec.max_wait && Protocol.wait_ms(spec.max_wait)) / 1000.0
        reschedule(job, now + [r.retry_after - reach, reach / 2, 0.001].max, nil)
        nil
      end

      def leased(spec, job, args, &block)
        items = spec.items(limiter, args)
        flow = spec.flow_for(job)
        begin
          # With a flow: wait in its queue (on the module); never poll.
          lease = limiter.lease_within(items, spec.ttl_map, spec.max_wait, 0, spec.not_sent, flow)
        rescue RateLimited => e
          raise if e.result.never?

          hops = job[HOPS].to_i
          pause = [LEASE_BACKOFF[0] * 2**[hops, 10].min, LEASE_BACKOFF[1]].min
          reschedule(job, now + [e.retry_after, pause].min, nil)
          return
        end
        Sidekiq.lease = lease
        begin
          lease.run { block.call }
        ensure
          Sidekiq.lease = nil
        end
      end

      # Pushes the job again, same jid and arguments, for `at` (epoch
      # seconds), carrying its turn; the fetched copy then ends here.
      def reschedule(job, at, turn)
        item = job.dup
        item.delete("enqueued_at")
        item[HOPS] = job[HOPS].to_i + 1
        turn ? item[TURN] = turn : item.delete(TURN)
        item["at"] = at
        ::Sidekiq::Client.push(item)
      end
    end
  end
end
