# frozen_string_literal: true

require "digest/sha1"
require "securerandom"

module TbLimiter
  # How each operation is spelled as a command, the Lua fallback's source,
  # and how the server's errors are read.
  module Protocol
    # Source of the Lua fallback: tb.lua in this gem, a byte-identical copy
    # of the repository's lua/tb.lua (`make lua-sync`).
    SCRIPT = File.binread(File.join(__dir__, "tb.lua")).freeze
    # Its SHA-1, as EVALSHA takes it.
    SCRIPT_SHA = Digest::SHA1.hexdigest(SCRIPT).freeze
    # The longest wait the module accepts by default (tb.max-wait-ms), and
    # the one the Lua fallback always accepts.
    DEFAULT_MAX_WAIT_MS = Catalogue::DEFAULT_MAX_WAIT_MS
    # The module's error for a wait above tb.max-wait-ms, the setting's value
    # in parentheses (older modules send none).
    MAX_WAIT = /#{Regexp.escape(Catalogue::ERR_WAIT_EXCEEDS.delete_prefix("ERR ").sub(" ({})", ""))}(?: \((\d+)\))?/.freeze
    # Largest lease id (the module's and the Lua fallback's: 2^53 - 1).
    LUA_MAX_LEASE_ID = Catalogue::MAX_LEASE_ID
    # A flow's name: 1 to this many bytes; its weight: 1 to MAX_WEIGHT.
    MAX_FLOW_NAME = Catalogue::MAX_FLOW_NAME
    MAX_WEIGHT = Catalogue::MAX_WEIGHT
    # The server's errors for a bad FLOW name or WEIGHT (checked here first).
    ERR_FLOW_NAME = Catalogue::ERR_FLOW_NAME
    ERR_WEIGHT = Catalogue::ERR_WEIGHT

    # One command: its name, its keys and its other arguments, in the order
    # the module takes them.
    Call = Struct.new(:name, :keys, :args) do
      # Arguments for a server with the module.
      def module_args
        return [name, keys.size.to_s, *keys, *args] if name == "TB.MCONSUME"

        [name, *keys, *args]
      end

      # EVALSHA/EVAL arguments after the script (or its SHA): numkeys, the
      # keys, then the command name and its arguments; before them, for a
      # call that may grant a lease, LEASE-SEED r: the script cannot draw
      # secure randomness, so its lease ids come from r, a random integer
      # from 1 to 2^53 - 1 drawn here (lua/tb.lua). The one place that
      # spells the script's calling convention.
      def script_args
        if args.any? { |a| a.to_s.upcase == "LEASE" }
          seed = SecureRandom.random_number(LUA_MAX_LEASE_ID) + 1
          return [keys.size.to_s, *keys, "LEASE-SEED", seed.to_s, name, *args]
        end
        [keys.size.to_s, *keys, name, *args]
      end
    end

    module_function

    # A token count as the commands' argument.
    def amount(n, what = "n")
      raise TypeError, "#{what} must be an Integer" unless n.is_a?(Integer)

      n.to_s
    end

    # A wait in seconds as whole milliseconds, rounded down so the server
    # never makes the caller wait longer than asked.
    def wait_ms(seconds)
      unless seconds.is_a?(Numeric) && seconds >= 0 && seconds.finite?
        raise ArgumentError, "a wait must be a finite number of seconds >= 0, got #{seconds.inspect}"
      end

      (seconds * 1000).floor
    end

    # A lease TTL in seconds as whole milliseconds (at least 1).
    def lease_ttl_ms(ttl)
      ms = wait_ms(ttl)
      raise ArgumentError, "a lease TTL must be at least 1 ms, got #{ttl.inspect} s" if ms < 1

      ms
    end

    # `FLOW name [WEIGHT w]` (WEIGHT left out when 1), or [] without a flow;
    # checked as the server checks it, before any round trip: a bad name or
    # weight is an ArgumentError with the server's own error line.
    def flow_args(flow, weight)
      if flow.nil?
        raise ArgumentError, ERR_WEIGHT unless weight.nil?

        return []
      end
      raise TypeError, "flow must be a String, not a #{flow.class}" unless flow.is_a?(String)
      raise ArgumentError, ERR_FLOW_NAME unless flow.bytesize.between?(1, MAX_FLOW_NAME)
      return ["FLOW", flow] if weight.nil? || weight == 1
      raise ArgumentError, ERR_WEIGHT unless weight.is_a?(Integer) && weight.between?(1, MAX_WEIGHT)

      ["FLOW", flow, "WEIGHT", weight.to_s]
    end

    # The server's reply to a command it does not know, or a cluster
    # client's refusal to route one.
    def unknown_command?(error)
      text = error.message.downcase
      text.include?("unknown command") || text.include?("command doesn't exist")
    end

    def noscript?(error) = error.message.start_with?("NOSCRIPT")

    def noperm?(error) = error.message.start_with?("NOPERM")

    # [refused, limit]: whether `error` is "ERR wait exceeds tb.max-wait-ms
    # (N)", and N when the server says it.
    def max_wait_error(error)
      m = MAX_WAIT.match(error.message)
      return [false, nil] unless m

      [true, m[1]&.to_i]
    end
  end
end
