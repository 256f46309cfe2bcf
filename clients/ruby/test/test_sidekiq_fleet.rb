# frozen_string_literal: true

# Real Sidekiq worker processes share fleet-wide limits through
# TbLimiter::Sidekiq::Middleware; a fake API in this process records when
# each call arrives. With a backlog deeper than the wait a reservation may
# reach: every job runs exactly once, none is left behind, and at every
# instant the calls stay within the limit (the worst window of T seconds
# at or under capacity + rate * T). The figures are printed.

require_relative "helper"
require "sidekiq"
require "sidekiq/api"

class FleetApi
  attr_reader :calls, :max_inflight

  def initialize(hold:, used:)
    @server = TCPServer.new("127.0.0.1", 0)
    @hold = hold
    @used = used
    @calls = []
    @inflight = Hash.new(0)
    @max_inflight = Hash.new(0)
    @lock = Mutex.new
    @thread = Thread.new { loop { serve(@server.accept) } }
  end

  def port = @server.addr[1]

  def stop
    @thread.kill
    @server.close
  end

  private

  def serve(sock)
    Thread.new do
      kind, account, jid = sock.gets.to_s.split
      at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      @lock.synchronize do
        @calls << [at, kind, account, jid]
        next unless kind == "llm"

        @inflight[account] += 1
        @max_inflight[account] = [@max_inflight[account], @inflight[account]].max
      end
      if kind == "llm"
        sleep @hold
        @lock.synchronize { @inflight[account] -= 1 }
        sock.write("#{@used}\n")
      else
        sock.write("ok\n")
      end
    ensure
      sock.close
    end
  end
end

class SidekiqFleetTest < Minitest::Test
  PROCESSES = 3
  THREADS = 5
  RATE = 10          # calls per second per account (reserved form)
  CAPACITY = 5
  MAX_WAIT = 2.0     # a reservation reaches 2 s ahead ...
  JOBS = { "a" => 40, "b" => 20 } # ... the backlog of "a" is (40 - 5) / 10 = 3.5 s deep
  RPM_RATE = 5       # leased form: requests per second
  RPM_CAPACITY = 3
  TPM_RATE = 1000
  TPM_CAPACITY = 600
  ESTIMATE = 100
  USED = 150         # what each call really uses (settled)
  INFLIGHT = 3
  HOLD = 0.3         # seconds each leased call takes
  LEASED_JOBS = 20
  WINDOWS = [0.0, 0.5, 1.0, 2.0, 4.0].freeze
  DEADLINE = 90

  def sidekiq_bin
    path = ENV["PATH"].split(":").map { File.join(_1, "sidekiq") }.find { File.executable?(_1) }
    path or raise "the sidekiq command is missing: install Debian's ruby-sidekiq (make ruby-deps)"
  end

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # The most calls of `times` within any closed window of `t` seconds.
  def worst_window(times, t)
    times = times.sort
    j = 0
    best = 0
    times.each_with_index do |start, i|
      j = i if j < i
      j += 1 while j + 1 < times.size && times[j + 1] - start <= t
      best = [best, j - i + 1].max
    end
    best
  end

  def test_a_fleet_keeps_the_limits_and_runs_every_job_once = fleet(with_module: true)

  def test_a_fleet_on_the_lua_fallback_too = fleet(with_module: false)

  def fleet(with_module:)
    server = TestServers::Server.new(with_module: with_module)
    api = FleetApi.new(hold: HOLD, used: USED)
    redis = server.client
    env = {
      "TB_FLEET_REDIS" => server.url, "TB_FLEET_API" => api.port.to_s,
      "TB_FLEET_RATE" => RATE.to_s, "TB_FLEET_CAPACITY" => CAPACITY.to_s, "TB_FLEET_MAX_WAIT" => MAX_WAIT.to_s,
      "TB_FLEET_RPM_RATE" => RPM_RATE.to_s, "TB_FLEET_RPM_CAPACITY" => RPM_CAPACITY.to_s,
      "TB_FLEET_TPM_RATE" => TPM_RATE.to_s, "TB_FLEET_TPM_CAPACITY" => TPM_CAPACITY.to_s,
      "TB_FLEET_ESTIMATE" => ESTIMATE.to_s, "TB_FLEET_INFLIGHT" => INFLIGHT.to_s
    }
    app = File.join(__dir__, "fleet", "app.rb")
    logs = Dir.mktmpdir("tb-rb-sidekiq-")
    pids = Array.new(PROCESSES) do |i|
      Process.spawn(env, sidekiq_bin, "-r", app, "-c", THREADS.to_s, "-q", "api", "-q", "llm", "-t", "5",
                    in: File::NULL, out: File.join(logs, "w#{i}.log"), err: [:child, :out])
    end
    begin
      # Every process up (its heartbeat in Redis), and its scheduler past
      # its first random pause (up to 5 s when poll_interval_average is set).
      wait_until(30, "#{PROCESSES} Sidekiq processes to start (logs in #{logs})") do
        dead = pids.find { Process.waitpid(_1, Process::WNOHANG) }
        flunk "a Sidekiq process exited at start:\n#{File.read(File.join(logs, "w#{pids.index(dead)}.log"))}" if dead
        redis.scard("processes") == PROCESSES
      end
      sleep 5.5

      Sidekiq.configure_client { |c| c.redis = { url: server.url } }
      client = Sidekiq::Client.new
      jids = []
      JOBS.each { |acct, n| n.times { |i| jids << client.push("class" => "FleetJob", "queue" => "api", "args" => [acct, i]) } }
      LEASED_JOBS.times { |i| jids << client.push("class" => "LeasedJob", "queue" => "llm", "args" => ["z", i]) }
      started = now

      wait_until(DEADLINE, "every job to run (#{redis.hlen('fleet:runs')} of #{jids.size} ran; logs in #{logs})") do
        redis.hlen("fleet:runs") == jids.size
      end
      elapsed = now - started
      # Stop the workers (Sidekiq finishes or pushes back what it holds), so
      # what the checks below see is final: no job can run again after them.
      pids.each { TestServers.stop_pid(_1, 15) }

      runs = redis.hgetall("fleet:runs")
      hops = redis.hgetall("fleet:hops").transform_values(&:to_i)
      stats = Sidekiq::Stats.new
      assert_equal jids.sort, runs.keys.sort, "every job ran"
      assert runs.values.all? { _1 == "1" }, "a job ran twice: #{runs.select { |_, v| v != '1' }}"
      assert_equal 0, Sidekiq::ScheduledSet.new.size, "jobs left scheduled"
      assert_equal 0, Sidekiq::RetrySet.new.size, "jobs sent to retry (a re-schedule must not burn a retry)"
      assert_equal 0, Sidekiq::DeadSet.new.size, "dead jobs"
      assert_equal 0, stats.enqueued, "jobs left in a queue"
      assert_equal 0, stats.failed, "failed jobs"

      puts
      puts "Sidekiq fleet on #{TestServers.version}, #{with_module ? 'the module' : 'the Lua fallback'}: " \
           "#{PROCESSES} processes x #{THREADS} threads, " \
           "#{jids.size} jobs in #{elapsed.round(1)} s"
      JOBS.each do |acct, n|
        times = api.calls.select { |_, k, a, _| k == "call" && a == acct }.map(&:first)
        assert_equal n, times.size, "calls of account #{acct}"
        WINDOWS.each do |t|
          worst = worst_window(times, t)
          bound = CAPACITY + RATE * t
          puts format("  reserved, account %s (%d jobs, rate %d/s, capacity %d): worst %.1f s window %d calls, bound %g",
                      acct, n, RATE, CAPACITY, t, worst, bound)
          assert_operator worst, :<=, bound, "account #{acct}: #{worst} calls within #{t} s"
        end
      end
      reserved = api.calls.select { |_, k, _, _| k == "call" }.map(&:first)
      puts format("  reserved: calls over %.2f s (the limit allows %.2f s at the least)",
                  reserved.max - reserved.min, (JOBS.values.max - CAPACITY).fdiv(RATE))
      leased = api.calls.select { |_, k, _, _| k == "llm" }.map(&:first)
      puts format("  leased: calls over %.2f s (RPM allows %.2f s at the least)",
                  leased.max - leased.min, (LEASED_JOBS - RPM_CAPACITY).fdiv(RPM_RATE))
      assert_equal LEASED_JOBS, leased.size
      WINDOWS.each do |t|
        worst = worst_window(leased, t)
        bound = RPM_CAPACITY + RPM_RATE * t
        puts format("  leased (RPM %d/s cap %d, in flight %d): worst %.1f s window %d calls, bound %g",
                    RPM_RATE, RPM_CAPACITY, INFLIGHT, t, worst, bound)
        assert_operator worst, :<=, bound
      end
      puts "  leased: most calls in flight #{api.max_inflight['z']} (limit #{INFLIGHT})"
      assert_operator api.max_inflight["z"], :<=, INFLIGHT

      # Settled: the TPM bucket was charged the use reported, not the estimate.
      info = TbLimiter::Limiter.new(redis).bucket("fleet:llm:{z}:tpm", rate: TPM_RATE, capacity: TPM_CAPACITY).info
      slots = TbLimiter::Limiter.new(redis).bucket("fleet:llm:{z}:inflight", rate: 0, capacity: INFLIGHT).info
      assert_equal INFLIGHT, slots.tokens.to_i, "every in-flight slot released" if slots
      per_job = jids.map { hops.fetch(_1, 0) }
      reserved_hops = per_job.first(JOBS.values.sum)
      leased_hops = per_job.last(LEASED_JOBS)
      puts format("  re-schedules per job: reserved mean %.2f max %d; leased mean %.2f max %d; retries 0, dead 0",
                  reserved_hops.sum.fdiv(reserved_hops.size), reserved_hops.max,
                  leased_hops.sum.fdiv(leased_hops.size), leased_hops.max)
      puts "  TPM bucket after: #{info&.tokens&.to_f} tokens of #{TPM_CAPACITY}" if info
    ensure
      pids.each { TestServers.stop_pid(_1, 15) }
      api.stop
      redis.close
      server.stop
    end
  end

  def wait_until(seconds, what)
    limit = now + seconds
    until yield
      flunk "timed out after #{seconds} s waiting for #{what}" if now > limit
      sleep 0.1
    end
  end
end
