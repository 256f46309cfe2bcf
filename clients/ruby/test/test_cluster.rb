# frozen_string_literal: true

# redis-rb's own cluster client (Redis.new(cluster: [...])) as the
# limiter's client: three masters on free loopback ports, with the module
# and without it (the Lua fallback, found from the first call's error).

require_relative "helper"

class ClusterTest < Minitest::Test
  STABLE_DEADLINE = 30

  def self.free_cluster_port
    1000.times do
      port = rand(20_000..55_535)
      return port if [port, port + 10_000].all? { |p| (TCPServer.new("127.0.0.1", p).close || true) rescue false }
    end
    raise "no free port pair for a cluster node on 127.0.0.1"
  end

  def self.start(with_module)
    nodes = Array.new(3) do
      port = free_cluster_port
      TestServers::Server.new(with_module: with_module, port: port,
                              extra: ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                      "--cluster-node-timeout", "5000"])
    end
    cli = ENV["PATH"].split(":").map { File.join(_1, "redis-cli") }.find { File.executable?(_1) }
    raise "redis-cli not found: install redis-tools (make deps)" unless cli

    out = IO.popen([cli, "--cluster", "create", *nodes.map { "127.0.0.1:#{_1.port}" }, "--cluster-yes"],
                   err: [:child, :out], &:read)
    raise "redis-cli --cluster create failed:\n#{out}" unless $?.success?

    limit = Process.clock_gettime(Process::CLOCK_MONOTONIC) + STABLE_DEADLINE
    until nodes.all? { |n| n.client.call("CLUSTER", "INFO").include?("cluster_state:ok") }
      raise "the cluster did not become stable within #{STABLE_DEADLINE} s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > limit

      sleep 0.1
    end
    nodes
  end

  def self.run(reporter, options = {})
    @clusters = { module: start(true), lua: start(false) }
    super
  ensure
    @clusters&.each_value { |nodes| nodes.each(&:stop) }
  end

  class << self
    attr_reader :clusters
  end

  %i[module lua].each do |backend|
    define_method("test_a_cluster_client_on_#{backend}") do
      redis = Redis.new(cluster: ["redis://127.0.0.1:#{self.class.clusters[backend][0].port}"])
      lim = TbLimiter::Limiter.new(redis)
      # Keys on every master.
      %w[a b c d e f g h].each { |k| assert lim.bucket("cl:#{k}", rate: 1, capacity: 2).consume.allowed? }
      assert_equal backend, lim.backend
      rpm = lim.bucket("cl:{u}:rpm", rate: "60/m", capacity: 2)
      slot = lim.bucket("cl:{u}:slot", rate: 0, capacity: 1)
      assert lim.consume_many([[rpm, 1], [slot, 0]]).allowed?
      lim.lease_many([[rpm, 1], [slot, 1]], ttl: { 1 => 30 }) do |l|
        assert_operator l.ids[1], :>, 0
        refute slot.consume.allowed?
      end
      assert_equal 1, slot.info&.tokens&.to_i || 1, "released"
      assert lim.bucket("cl:r", rate: 10, capacity: 1).tap(&:consume).acquire(timeout: 1).allowed?
      # A flow: on the module a wait on the key's node; on the fallback ignored.
      assert lim.bucket("cl:f", rate: 10, capacity: 1).tap(&:consume).acquire(timeout: 1, flow: "t", weight: 2).allowed?
      slot.lease(ttl: 30, timeout: 1, flow: "t") { |l| assert_operator l.id, :>, 0 }
    ensure
      redis&.close
    end
  end
end
