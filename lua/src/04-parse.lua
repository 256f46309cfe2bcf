---------------------------------------------------------------------------
-- Argument parsing (src/parse/).
---------------------------------------------------------------------------

-- An unsigned decimal integer of at most max_str: ASCII digits only, at
-- most 20 of them (u64), leading zeros allowed.
local function parse_int(s, max_str, err)
  if #s == 0 or #s > 20 or not s:match('^[0-9]+$') then return nil, err end
  local t = s:gsub('^0+', '')
  if #t > #max_str or (#t == #max_str and t > max_str) then return nil, err end
  if t == '' then return 0 end
  return tonumber(t)
end

local UNITS = { s = 1, m = 60, h = 3600, d = 86400 }

-- Bounds that only out-of-range rates pass (src/parse/ derives them):
-- more significant digits, an exponent (of the value without trailing zeros)
-- outside [EXP_MIN, EXP_MAX], and exponent digits beyond any argument's length.
local MAX_SIGNIFICANT = 64
local EXP_MIN, EXP_MAX = -40, 20
local EXP_DIGITS = 15

-- A rate: returns num, den (reduced, exact doubles) or nil, error. Every
-- spelling of a value in range is accepted; the work is linear in #s.
local function parse_rate(s)
  local number, unit = s, 1
  local len = #s
  if len >= 2 and s:sub(len - 1, len - 1) == '/' then
    unit = UNITS[s:sub(len, len):lower()]
    if not unit then return nil, ERR_RATE end
    number = s:sub(1, len - 2)
  end
  local body, exp = number, 0
  local epos = number:find('[eE]')
  if epos then
    body = number:sub(1, epos - 1)
    local es, neg = number:sub(epos + 1), false
    local sign = es:sub(1, 1)
    if sign == '-' then neg = true; es = es:sub(2) elseif sign == '+' then es = es:sub(2) end
    if #es == 0 or not es:match('^[0-9]+$') then return nil, ERR_RATE end
    es = es:match('^0*(.*)$')
    if #es > EXP_DIGITS then exp = 10 ^ EXP_DIGITS else exp = tonumber(es) or 0 end
    if neg then exp = -exp end
  end
  local int, frac = body, ''
  local dot = body:find('.', 1, true)
  if dot then int = body:sub(1, dot - 1); frac = body:sub(dot + 1) end
  if #int == 0 and #frac == 0 then return nil, ERR_RATE end
  local run = int .. frac
  if not run:match('^[0-9]*$') then return nil, ERR_RATE end
  local lead = run:find('[1-9]')
  if not lead then return 0, 1 end
  local last = run:match('^.*()[1-9]')
  if last - lead + 1 > MAX_SIGNIFICANT then return nil, ERR_RATE_RANGE end
  exp = exp - #frac + (#run - last)
  if exp < EXP_MIN or exp > EXP_MAX then return nil, ERR_RATE_RANGE end
  local mantissa = run:sub(lead, last)
  if #mantissa <= 15 and exp > -16 and exp < 16 then
    -- Everything fits in doubles: reduce with an exact Euclid on fmod.
    local n, d = tonumber(mantissa), unit
    if exp >= 0 then n = n * 10 ^ exp else d = d * 10 ^ (-exp) end
    if n < TWO52 and d < TWO52 then
      local a, b = n, d
      while b > 0 do a, b = b, math.fmod(a, b) end
      n, d = n / a, d / a
      if n > MAX_RATE_NUM or d > MAX_RATE_DEN then return nil, ERR_RATE_RANGE end
      return n, d
    end
  end
  local num, den
  if exp >= 0 then
    num = bn_str(mantissa .. string.rep('0', exp))
    den = bn(unit)
  else
    num = bn_str(mantissa)
    den = bn_mul(bn_str('1' .. string.rep('0', -exp)), bn(unit))
  end
  local g = bn_gcd(num, den)
  num = bn_divmod(num, g)
  den = bn_divmod(den, g)
  if bn_cmp(num, bn(MAX_RATE_NUM)) > 0 or bn_cmp(den, bn(MAX_RATE_DEN)) > 0 then
    return nil, ERR_RATE_RANGE
  end
  return bn_num(num), bn_num(den)
end
