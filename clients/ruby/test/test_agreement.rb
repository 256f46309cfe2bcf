# frozen_string_literal: true

# The module and the gem's Lua fallback answer reply for reply: the same
# calls, made through the Ruby client on a server with the module and on
# one without (backend :lua), both frozen at the same instant by the
# repository's clock shim (tests/clockshift), give the same replies, the
# same TB.INFO and the same key expiry. Lease ids are random by contract
# (each backend's own ids are used in its later calls, not compared).

require_relative "helper"

module Clock
  SEC = 1_000_000
  T0 = 1_795_300_000 * SEC

  module_function

  # tests/clockshift/clockshift.c built into target/clockshift (as the
  # Python suite does) when missing or older than its source.
  def lib
    src = File.join(TestServers::REPO, "tests/clockshift/clockshift.c")
    out = File.join(TestServers::REPO, "target/clockshift/libclockshift.so")
    if !File.file?(out) || File.mtime(out) < File.mtime(src)
      FileUtils.mkdir_p(File.dirname(out))
      tmp = "#{out}.#{Process.pid}"
      system(ENV.fetch("CC", "cc"), "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o", tmp, src, "-ldl",
             exception: true)
      File.rename(tmp, out)
    end
    out
  end

  # The control file: a seqlock word, a mode (1: frozen), microseconds.
  class File24
    def initialize(path)
      @path = path
      @seq = 0
      File.binwrite(path, [0, 1, T0].pack("q3"))
    end

    attr_reader :path

    def freeze(at_us)
      File.open(@path, "r+b") do |f|
        f.write([@seq + 1].pack("q"))
        f.flush
        f.write([1, at_us].pack("q2"))
        f.flush
        @seq += 2
        f.seek(0)
        f.write([@seq].pack("q"))
      end
    end
  end
end

class AgreementTest < Minitest::Test
  SEC = Clock::SEC
  Call = TbLimiter::Protocol::Call

  # [microseconds to move the clock first, name to save the lease id as,
  # the command by its module spelling ("$x": the saved lease id)].
  STEPS = [
    [0, nil, %w[TB.CONSUME k 10 5 1]],
    [0, nil, %w[TB.CONSUME k 10 5 5]],
    [0, nil, %w[TB.CONSUME k 10 5 6]],
    [1000, nil, %w[TB.CONSUME k 10 5 0]],
    [0, nil, %w[TB.CONSUME k 10 5 3 RESERVE 1000]],
    [0, nil, %w[TB.CONSUME k 10 5 3 RESERVE 10]],
    [250_000, nil, %w[TB.REFUND k 2]],
    [0, nil, %w[TB.CONSUME k 10 5 4 ATMOST]],
    [0, nil, %w[TB.CONSUME k 10 5 4 ATMOST MIN 2]],
    [0, nil, %w[TB.CONSUME r 100/m 60 1]],
    [0, nil, %w[TB.CONSUME r 0.5 1 1 RESERVE 60000]],
    [0, nil, %w[TB.CONSUME r 0.5 1 1 RESERVE 60001]],
    [0, nil, %w[TB.MCONSUME 2 {u}a {u}b 60/m 60 1 1000/m 1000 600]],
    [0, nil, %w[TB.MCONSUME 2 {u}a {u}b 60/m 60 1 1000/m 1000 600]],
    [0, nil, %w[TB.MCONSUME 2 {u}a {u}b 60/m 60 1 1000/m 1000 600 RESERVE 60000]],
    [0, nil, %w[TB.MCONSUME 2 {u}a {u}b 60/m 60 10 1000/m 1000 900 ATMOST]],
    [0, "a", %w[TB.CONSUME in 0 2 1 LEASE 1000]],
    [1000, "b", %w[TB.CONSUME in 0 2 1 LEASE 2000]],
    [0, nil, %w[TB.CONSUME in 0 2 1 LEASE 1000]],
    [0, nil, %w[TB.RELEASE in $a]],
    [0, nil, %w[TB.RELEASE in $a]],
    [1_000_000, nil, %w[TB.RELEASE in $b USED 1]],
    [0, "t", %w[TB.CONSUME tpm 100 1000 400 LEASE 60000]],
    [10_000, nil, %w[TB.RELEASE tpm $t USED 900]],
    [0, "m", %w[TB.MCONSUME 3 {v}r {v}t {v}i 60/m 60 1 1000/m 1000 300 0 1 1 LEASE 2 30000 LEASE 3 30000]],
    [0, nil, %w[TB.MCONSUME 3 {v}r {v}t {v}i 60/m 60 1 1000/m 1000 300 0 1 1 LEASE 3 30000]],
    [31 * SEC, nil, %w[TB.MCONSUME 2 {v}t {v}i 1000/m 1000 1 0 1 1 LEASE 2 100]],
    # A debt deeper than the leases out: the wait for a peek counts a lease
    # coming back to a level still below 0 (seed 110455538 found it).
    [0, nil, %w[TB.CONSUME d 0.5 2 2 LEASE 5000]],
    [2 * SEC, nil, %w[TB.CONSUME d 0.5 2 1 LEASE 5000]],
    [37_000, nil, %w[TB.CONSUME d 0.5 2 2 RESERVE 5000]],
    [1000, nil, %w[TB.CONSUME d 0.5 2 0 RESERVE 500]],
    [0, nil, %w[TB.CONSUME d 0.5 2 1]],
    [0, nil, %w[TB.CONSUME e abc 1 1]],
    [0, nil, %w[TB.CONSUME e 1 -1 1]],
    [0, nil, %w[TB.CONSUME e 1 1 1 LEASE 0]],
    [0, nil, %w[TB.CONSUME e 1 1 1 RESERVE 5 ATMOST]],
    [0, nil, %w[TB.MCONSUME 2 {w}a {w}a 1 1 1 1 1 1]],
    [0, nil, %w[TB.RELEASE e 1 USED x]],
    [100 * SEC, nil, %w[TB.INFO k]]
  ].freeze

  def self.run(reporter, options = {})
    Dir.mktmpdir("tb-rb-clock-") do |d|
      @clock = Clock::File24.new(File.join(d, "clock"))
      env = { "LD_PRELOAD" => Clock.lib, "TB_CLOCK_FILE" => @clock.path }
      debug = ["--enable-debug-command", "local"]
      # One at a time, so that `ensure` stops the first if the second fails.
      @servers = []
      [true, false].each { @servers << TestServers::Server.new(with_module: _1, env: env, extra: debug) }
      # Active expiry off: on a frozen clock it deletes a key whose expiry is
      # the current millisecond (Redis 8.2 expires at now >= t) while a lookup
      # keeps it (now > t), at moments set by the real time of its cycle, so
      # the two servers could hold different keys. Lookups alone expire keys
      # alike.
      @servers.each do |s|
        c = s.client
        c.call("DEBUG", "SET-ACTIVE-EXPIRE", 0)
      ensure
        c&.close
      end
      super
    ensure
      @servers&.each(&:stop)
    end
  end

  class << self
    attr_reader :clock, :servers
  end

  def setup
    @raw = self.class.servers.map(&:client)
    @raw.each(&:flushall)
    @lims = [TbLimiter::Limiter.new(@raw[0], backend: :module), TbLimiter::Limiter.new(@raw[1], backend: :lua)]
    @now = Clock::T0
    self.class.clock.freeze(@now)
  end

  def teardown = @raw.each(&:close)

  def run_call(lim, args)
    name = args[0]
    keys, rest = name == "TB.MCONSUME" ? [args[2, args[1].to_i], args[(2 + args[1].to_i)..]] : [args[1, 1], args[2..]]
    lim.execute(Call.new(name, keys, rest))
  rescue Redis::CommandError => e
    "error: #{e.message}"
  end

  # The lease ids of a reply: TB.CONSUME's last element, TB.MCONSUME's
  # last k (one per key).
  def lease_positions(args, reply)
    return [] unless reply.is_a?(Array) && args.include?("LEASE")

    args[0] == "TB.MCONSUME" ? ((reply.size - args[1].to_i)...reply.size).to_a : [reply.size - 1]
  end

  def same(expected, actual, message)
    expected.nil? ? assert_nil(actual, message) : assert_equal(expected, actual, message)
  end

  def test_replies_agree = agree(STEPS)

  # A seeded random timeline of every operation on a few buckets (the seed
  # is printed by a failure, and TB_AGREEMENT_SEED replays one).
  def test_a_random_timeline_agrees
    seed = Integer(ENV.fetch("TB_AGREEMENT_SEED", rand(2**32)))
    rng = Random.new(seed)
    buckets = [%w[{x}a 10 5], %w[{x}b 100/m 60], %w[{x}c 0 3], %w[{x}d 0.5 2]]
    steps = Array.new(300) do |i|
      key, rate, cap = buckets[rng.rand(buckets.size)]
      n = rng.rand(0..cap.to_i + 1).to_s
      delta = [0, 0, 1000, 37_000, 250_000, 2 * SEC][rng.rand(6)]
      step = case rng.rand(9)
             when 0, 1 then ["TB.CONSUME", key, rate, cap, n]
             when 2 then ["TB.CONSUME", key, rate, cap, n, "RESERVE", [0, 500, 5000, 60_000][rng.rand(4)].to_s]
             when 3 then ["TB.CONSUME", key, rate, cap, n, "ATMOST"]
             when 4 then ["TB.REFUND", key, rng.rand(0..3).to_s]
             when 5 then ["TB.CONSUME", key, rate, cap, [n, "1"].max, "LEASE", [1, 300, 5000][rng.rand(3)].to_s]
             when 6 then ["TB.RELEASE", key, "$l", *(rng.rand(2).zero? ? [] : ["USED", rng.rand(0..4).to_s])]
             when 7
               k2, r2, c2 = buckets[(buckets.index { _1[0] == key } + 1) % buckets.size]
               ["TB.MCONSUME", "2", key, k2, rate, cap, n, r2, c2, "1", *(rng.rand(2).zero? ? [] : %w[RESERVE 10000])]
             else ["TB.INFO", key]
             end
      [delta, step.include?("LEASE") ? "l" : nil, step]
    end
    agree(steps, "seed #{seed}")
  end

  def agree(steps, context = "")
    ids = [{ "l" => 0 }, { "l" => 0 }]
    steps.each do |delta, save, step|
      @now += delta
      self.class.clock.freeze(@now)
      replies = @lims.each_with_index.map do |lim, i|
        run_call(lim, step.map { _1.start_with?("$") ? ids[i].fetch(_1[1..]).to_s : _1 })
      end
      masked = replies.map do |r|
        pos = lease_positions(step, r)
        r.is_a?(Array) ? r.each_with_index.map { |x, j| pos.include?(j) ? (x.to_i.positive? ? "id" : 0) : x } : r
      end
      same masked[0], masked[1], "#{context} #{step.join(' ')}: module #{replies[0].inspect}, lua #{replies[1].inspect}"
      if save && replies[0].is_a?(Array) && replies[0][0] == 1
        replies.each_with_index { |r, i| ids[i][save] = r[lease_positions(step, r).find { |j| r[j].to_i.positive? }] }
      end
      keys = step[0] == "TB.MCONSUME" ? step[2, step[1].to_i] : [step[1]]
      keys.uniq.each do |k|
        infos = @lims.map { |lim| run_call(lim, ["TB.INFO", k]) }
        same infos[0], infos[1], "TB.INFO #{k} after #{step.join(' ')}"
        same(*@raw.map { _1.call("PEXPIRETIME", k) }, "expiry of #{k} after #{step.join(' ')}")
      end
    end
  end
end
