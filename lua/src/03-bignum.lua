---------------------------------------------------------------------------
-- Exact non-negative integers: little-endian arrays of base-1e7 limbs,
-- without leading zero limbs (zero is the empty array). Limb products stay
-- below 1e14, so every intermediate is an exact double.
---------------------------------------------------------------------------
local BASE = 10000000

local function bn(x) -- from a non-negative integer-valued double
  local r = {}
  while x > 0 do
    local d = math.fmod(x, BASE)
    r[#r + 1] = d
    x = (x - d) / BASE
  end
  return r
end

local function bn_str(s) -- from a string of decimal digits
  local r = {}
  local i = #s
  while i >= 1 do
    local j = math.max(1, i - 6)
    r[#r + 1] = tonumber(s:sub(j, i))
    i = j - 1
  end
  while #r > 0 and r[#r] == 0 do r[#r] = nil end
  return r
end

local function bn_num(a) -- to a double (exact below 2^53)
  local v = 0
  for i = #a, 1, -1 do v = v * BASE + a[i] end
  return v
end

local function bn_cmp(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  for i = #a, 1, -1 do
    if a[i] ~= b[i] then return a[i] < b[i] and -1 or 1 end
  end
  return 0
end

local function bn_add(a, b)
  local r, carry = {}, 0
  for i = 1, math.max(#a, #b) do
    local v = (a[i] or 0) + (b[i] or 0) + carry
    if v >= BASE then r[i] = v - BASE; carry = 1 else r[i] = v; carry = 0 end
  end
  if carry > 0 then r[#r + 1] = carry end
  return r
end

local function bn_sub(a, b) -- a - b, requires a >= b
  local r, borrow = {}, 0
  for i = 1, #a do
    local v = a[i] - (b[i] or 0) - borrow
    if v < 0 then r[i] = v + BASE; borrow = 1 else r[i] = v; borrow = 0 end
  end
  while #r > 0 and r[#r] == 0 do r[#r] = nil end
  return r
end

local function bn_mul(a, b)
  if #a == 0 or #b == 0 then return {} end
  local r = {}
  for i = 1, #a + #b do r[i] = 0 end
  for i = 1, #a do
    local carry, ai = 0, a[i]
    for j = 1, #b do
      local v = r[i + j - 1] + ai * b[j] + carry
      local d = math.fmod(v, BASE)
      r[i + j - 1] = d
      carry = (v - d) / BASE
    end
    local k = i + #b
    while carry > 0 do
      local v = r[k] + carry
      local d = math.fmod(v, BASE)
      r[k] = d
      carry = (v - d) / BASE
      k = k + 1
    end
  end
  while #r > 0 and r[#r] == 0 do r[#r] = nil end
  return r
end

local function bn_approx(a) -- a double close to a (relative error ~1e-15)
  local v = 0
  for i = #a, 1, -1 do v = v * BASE + a[i] end
  return v
end

-- Quotient and remainder of a / b (b > 0), schoolbook long division in base
-- 1e7: each quotient limb is estimated in floating point (off by at most one
-- or two) and corrected exactly.
local function bn_divmod(a, b)
  local q, r = {}, {}
  local bf = bn_approx(b)
  for i = #a, 1, -1 do
    -- r = r * BASE + a[i]
    table.insert(r, 1, a[i])
    while #r > 0 and r[#r] == 0 do r[#r] = nil end
    local d = 0
    if bn_cmp(r, b) >= 0 then
      d = math.floor(bn_approx(r) / bf)
      if d > BASE - 1 then d = BASE - 1 end
      if d < 0 then d = 0 end
      local p = bn_mul(b, bn(d))
      while bn_cmp(p, r) > 0 do
        d = d - 1
        p = bn_sub(p, b)
      end
      while true do
        local p2 = bn_add(p, b)
        if bn_cmp(p2, r) > 0 then break end
        d = d + 1
        p = p2
      end
      r = bn_sub(r, p)
    end
    q[i] = d
  end
  for i = 1, #a do q[i] = q[i] or 0 end
  while #q > 0 and q[#q] == 0 do q[#q] = nil end
  return q, r
end

local TWO52 = 4503599627370496

-- The value of a bignum below 2^52 as a double, or nil.
local function small(a)
  if #a > 3 then return nil end
  local v = bn_num(a)
  if v >= TWO52 then return nil end
  return v
end

-- floor(a * b / c) and its remainder: doubles when the product stays below
-- 2^52 (exact, with the quotient corrected for rounding), bignums otherwise.
local function bn_mul_divmod(a, b, c)
  local x, y, z = small(a), small(b), small(c)
  if x and y and z and x * y < TWO52 then
    local p = x * y
    local q = math.floor(p / z)
    while q * z > p do q = q - 1 end
    while (q + 1) * z <= p do q = q + 1 end
    return bn(q), p - q * z
  end
  local q, r = bn_divmod(bn_mul(a, b), c)
  return q, #r
end

local function bn_mul_div_floor(a, b, c)
  local q = bn_mul_divmod(a, b, c)
  return q
end

local function bn_mul_div_ceil(a, b, c)
  local q, r = bn_mul_divmod(a, b, c)
  if r > 0 then q = bn_add(q, { 1 }) end
  return q
end

local function bn_gcd(a, b)
  while #b > 0 do
    local _, r = bn_divmod(a, b)
    a, b = b, r
  end
  return a
end

local BN_NANOS = bn(NANOS)
local BN_1000 = bn(1000)
local BN_U64_MAX = bn_str('18446744073709551615')
local BN_I64_MAX = bn_str('9223372036854775807')
local BN_MAX_EXPIRE_MS = bn_str(MAX_AMOUNT_STR) -- 2^53 ms

-- Integers are written as exact decimal strings (tostring keeps 14 digits).
local function fmt(x)
  return string.format('%.0f', x)
end
