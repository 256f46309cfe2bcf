# frozen_string_literal: true

module TbLimiter
  VERSION = "0.1.0"
end
