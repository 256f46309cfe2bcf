# frozen_string_literal: true

require "bigdecimal"

module TbLimiter
  # Rates as users write them, turned into the module's rate argument, as
  # the Python (tb_limiter/_rates.py) and Node clients do:
  #
  # * the module's own spelling: a decimal ("10", "0.5", "1e-3") or N/s,
  #   N/m, N/h, N/d ("100/m"), passed as is;
  # * the one of Flask-Limiter and `limits`: "100/minute", "10 per second",
  #   "5 per 10 seconds": capacity `amount`, refilling at `amount / seconds`
  #   per second (several joined by ";" make a group: Limiter#limits).
  module Rates
    # Seconds per unit, as `limits` counts them (a month is 30 days).
    UNITS = {
      "second" => 1, "minute" => 60, "hour" => 3600, "day" => 86_400,
      "month" => 30 * 86_400, "year" => 12 * 30 * 86_400
    }.freeze
    LIMIT = /\A\s*([0-9]+)\s*(?:\/|\s+per\s+|per)\s*([0-9]+)?\s*(second|minute|hour|day|month|year)s?\s*\z/i.freeze
    # The largest denominator of a rate's reduced fraction the module accepts.
    MAX_RATE_DEN = Catalogue::MAX_RATE_DEN
    # The module's units, widest first.
    MODULE_UNITS = [["d", 86_400], ["h", 3600], ["m", 60], ["s", 1]].freeze

    # `amount` per `seconds`: a bucket of capacity `amount` refilling at
    # `amount / seconds` per second.
    LimitSpec = Struct.new(:amount, :seconds, :text) do
      # The exact refill rate per second.
      def per_second = Rational(amount, seconds)
      # The rate as the module's argument.
      def rate = Rates.fraction_arg(per_second)
      # A stable suffix naming this limit in a key ("10/1s").
      def key_suffix = "#{amount}/#{seconds}s"
    end

    module_function

    # Every limit of a `limits`-style string ("10/second;1000/day").
    # Raises ArgumentError for anything else.
    def parse_limits(text)
      text.split(/[,;|]/).map do |part|
        m = LIMIT.match(part)
        raise ArgumentError, "not a rate limit string: #{part.strip.inspect} (write e.g. '100/minute' or '10 per second')" unless m

        amount = m[1].to_i
        multiples = (m[2] || "1").to_i
        unit = m[3].downcase
        raise ArgumentError, "a limit's period must be positive: #{part.strip.inspect}" if multiples.zero?

        period = multiples == 1 ? unit : "#{multiples} #{unit}s"
        LimitSpec.new(amount, multiples * UNITS.fetch(unit), "#{amount}/#{period}")
      end
    end

    # True for a `limits`-style string (it names a time unit in words).
    def limits_string?(text)
      text.match?(/[a-z]{3,}/i) && !%w[inf infinity nan +inf -inf].include?(text.strip.downcase)
    end

    # The rate as the commands' argument. Module spellings pass unchanged
    # ("100/m"); floats their shortest exact form; a single `limits`-style
    # limit becomes its exact per-second rate.
    def rate_arg(rate)
      case rate
      when true, false then raise TypeError, "rate must be a number or a string, not a boolean"
      when String
        return rate unless limits_string?(rate)

        limits = parse_limits(rate)
        raise ArgumentError, "#{rate.inspect} holds #{limits.size} limits: use limiter.limits(key, #{rate.inspect})" if limits.size != 1

        limits[0].rate
      when Integer
        raise ArgumentError, "rate must be non-negative, got #{rate}" if rate.negative?

        rate.to_s
      when Float
        raise ArgumentError, "rate must be finite and non-negative, got #{rate}" if !rate.finite? || rate.negative?

        rate.to_s.sub("e+", "e").delete_suffix(".0")
      when BigDecimal then rate.to_s("F").delete_suffix(".0")
      when Rational then fraction_arg(rate)
      else raise TypeError, "unsupported rate type #{rate.class}"
      end
    end

    # The capacity a rate implies ("100/minute": 100), or nil.
    def implied_capacity(rate)
      rate.is_a?(String) && limits_string?(rate) ? parse_limits(rate)[0].amount : nil
    end

    # An exact rate as the module's argument: a decimal per second, minute,
    # hour or day when one of them is exact (5/3 -> "100/m"); else the
    # closest such decimal at or below the rate that the module accepts.
    def fraction_arg(rate)
      raise ArgumentError, "rate must be non-negative, got #{rate}" if rate.negative?

      MODULE_UNITS.reverse_each do |unit, seconds|
        text = terminating_decimal(rate * seconds)
        next if text.nil?

        f = Rational(text)
        next unless f.denominator * seconds / f.numerator.gcd(seconds) <= MAX_RATE_DEN

        return unit == "s" ? text : "#{text}/#{unit}"
      end
      best = nil
      MODULE_UNITS.each do |unit, seconds|
        per_unit = rate * seconds
        (0..30).each do |places|
          scale = 10**places
          numerator = per_unit.numerator * scale / per_unit.denominator
          value = Rational(numerator, scale * seconds)
          break if value.denominator > MAX_RATE_DEN
          next unless numerator.positive? && (best.nil? || value > best[0])

          text = decimal_text(numerator, places)
          best = [value, unit == "s" ? text : "#{text}/#{unit}"]
        end
      end
      raise ArgumentError, "rate #{rate} is too small for the module (below about 1e-12 per second)" if best.nil?

      best[1]
    end

    # `x` as a plain decimal string when it has one (denominator 2^a 5^b).
    def terminating_decimal(x)
      den = x.denominator
      twos = fives = 0
      (den /= 2; twos += 1) while (den % 2).zero?
      (den /= 5; fives += 1) while (den % 5).zero?
      return nil unless den == 1

      places = [twos, fives].max
      decimal_text(x.numerator * 10**places / x.denominator, places)
    end

    # numerator * 10^-places, without trailing zeros ("0.5", "100").
    def decimal_text(numerator, places)
      sign = numerator.negative? ? "-" : ""
      digits = numerator.abs.to_s.rjust(places + 1, "0")
      int = digits[0...(digits.size - places)]
      frac = digits[(digits.size - places)..].sub(/0+\z/, "")
      frac.empty? ? "#{sign}#{int}" : "#{sign}#{int}.#{frac}"
    end
  end
end

module TbLimiter
  module Rates
    # The exact rate, in tokens per second, of a module rate argument
    # ("10", "2.5e3", "100/m").
    def self.per_second(arg)
      seconds = 1
      if arg.size >= 2 && arg[-2] == "/"
        seconds = { "s" => 1, "m" => 60, "h" => 3600, "d" => 86_400 }.fetch(arg[-1].downcase)
        arg = arg[0...-2]
      end
      BigDecimal(arg).to_r / seconds
    end
  end
end
