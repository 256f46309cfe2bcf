# frozen_string_literal: true

# Shared by the tests: the installed gem (not this checkout's lib/), and
# real redis-server processes on free loopback ports (a start-up deadline,
# stopped by pid), as clients/python/tests/tbserver.py does. Environment:
# REDIS_SERVER (default redis-server on PATH), TB_MODULE (default
# target/release/libtb.so at the repository root). TB_RUBY_FROM_SOURCE=1
# with `ruby -I../lib` runs a test on the checkout's lib/ while editing.

require "minitest/autorun"
require "socket"
require "tmpdir"
require "fileutils"
require "redis"
Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)

gem "tb-limiter"
require "tb_limiter"

unless (ENV["GEM_HOME"] && Gem.loaded_specs["tb-limiter"].full_gem_path.start_with?(ENV["GEM_HOME"])) || ENV["TB_RUBY_FROM_SOURCE"]
  abort "error: tb_limiter was not loaded from the gem installed in GEM_HOME (#{Gem.loaded_specs["tb-limiter"]&.full_gem_path}): " \
        "run `make test-ruby`, which builds and installs it"
end

module TestServers
  REPO = File.expand_path("../../..", __dir__)
  START_DEADLINE = 15.0
  STOP_DEADLINE = 10.0

  module_function

  def redis_server_bin
    name = ENV.fetch("REDIS_SERVER", "redis-server")
    path = name.include?("/") ? name : ENV["PATH"].split(":").map { File.join(_1, name) }.find { File.executable?(_1) }
    raise "redis-server not found (#{name.inspect}): run `make test-ruby`" unless path && File.executable?(path)

    path
  end

  def module_path
    path = ENV.fetch("TB_MODULE", File.join(REPO, "target/release/libtb.so"))
    raise "tb module not found at #{path}: run `cargo build --release` first" unless File.file?(path)

    File.expand_path(path)
  end

  def free_port
    s = TCPServer.new("127.0.0.1", 0)
    s.addr[1]
  ensure
    s&.close
  end

  # A redis-server child process on 127.0.0.1, with or without the module.
  class Server
    attr_reader :port, :dir, :pid, :with_module

    def initialize(with_module:, extra: [], env: {}, port: nil)
      @with_module = with_module
      @dir = Dir.mktmpdir("tb-rb-")
      @port = port || TestServers.free_port
      args = [TestServers.redis_server_bin, "--port", @port.to_s, "--bind", "127.0.0.1", "--dir", dir,
              "--save", "", "--appendonly", "no", "--logfile", "redis.log"]
      args += ["--loadmodule", TestServers.module_path] if with_module
      args += extra
      @pid = Process.spawn(env, *args, in: File::NULL, chdir: dir)
      wait_ready
    end

    def url = "redis://127.0.0.1:#{port}/0"
    def client(**kw) = Redis.new(host: "127.0.0.1", port: port, **kw)

    def log_tail
      File.readlines(File.join(dir, "redis.log")).last(30).join
    rescue SystemCallError
      "(no log)"
    end

    def wait_ready
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + START_DEADLINE
      while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
        raise "redis-server exited:\n#{log_tail}" if Process.waitpid(pid, Process::WNOHANG)

        begin
          r = client(timeout: 1)
          return if r.ping == "PONG"
        rescue Redis::BaseConnectionError
          sleep 0.05
        ensure
          r&.close
        end
      end
      stop
      raise "redis-server did not answer PING within #{START_DEADLINE} s:\n#{log_tail}"
    end

    # SIGTERM by pid, SIGKILL after the deadline; removes the data dir.
    def stop
      TestServers.stop_pid(pid, STOP_DEADLINE)
      FileUtils.rm_rf(dir)
    end
  end

  def stop_pid(pid, deadline)
    Process.kill("TERM", pid)
    limit = Process.clock_gettime(Process::CLOCK_MONOTONIC) + deadline
    until Process.waitpid(pid, Process::WNOHANG)
      if Process.clock_gettime(Process::CLOCK_MONOTONIC) > limit
        Process.kill("KILL", pid)
        Process.waitpid(pid)
        break
      end
      sleep 0.05
    end
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  end

  def version
    `#{redis_server_bin} --version`.split[0, 3].join(" ")
  end
end
