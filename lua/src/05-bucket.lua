---------------------------------------------------------------------------
-- Bucket arithmetic (src/bucket.rs). A bucket is {w, f, t, rn, rd, c}: its
-- exact level at time t is w * 1e9 + f nano-tokens; at a later time u it is
-- min(c, that + (u - t) * rn * 1000 / rd), before t (a clock stepped back)
-- it is the same. A level "at now" is its floor in nano-tokens, a pair
-- (w, f) with 0 <= f < 1e9.
---------------------------------------------------------------------------

-- Nano-tokens from the level (w, f) up to `level` whole tokens (level > it).
local function nanos_to(w, f, level)
  local whole
  if w >= 0 then
    whole = bn(level - w)
  elseif level >= 0 then
    whole = bn_add(bn(level), bn(-w))
  else
    -- A level below 0 (a wait that counts leases coming back) above a
    -- deeper debt: bignums hold no sign, so subtract the magnitudes.
    whole = bn_sub(bn(-w), bn(-level))
  end
  return bn_sub(bn_mul(whole, BN_NANOS), bn(f))
end

local function need_nanos(b, level)
  return nanos_to(b.w, b.f, level)
end

-- Microseconds until `nanos` refill, rounded up (bignum); nil for rate 0.
local function micros_for(b, nanos)
  if b.rn == 0 then return nil end
  return bn_mul_div_ceil(nanos, bn(b.rd), bn_mul(bn(b.rn), BN_1000))
end

-- Nano-tokens refilled over `us` microseconds, rounded down (bignum).
local function refill(b, us)
  return bn_mul_div_floor(bn(us), bn_mul(bn(b.rn), BN_1000), bn(b.rd))
end

-- Adds a bignum of nano-tokens to (w, f). The sum stays below the capacity,
-- but the whole tokens added can pass 2^53 when they pay off a deep debt
-- (w < 0): that difference is taken in bignums, exactly.
local function plus(w, f, nanos)
  local aw, af = bn_divmod(nanos, BN_NANOS)
  f = f + bn_num(af)
  if w < 0 then
    local debt = bn(-w)
    if bn_cmp(aw, debt) >= 0 then w = bn_num(bn_sub(aw, debt)) else w = -bn_num(bn_sub(debt, aw)) end
  else
    w = w + bn_num(aw)
  end
  if f >= NANOS then f = f - NANOS; w = w + 1 end
  return w, f
end

-- The shortest time over which refill is a whole number of nano-tokens:
-- rd / gcd(rn * 1000, rd) (1 for rate 0). Every step is an exact double.
local function exact_period(b)
  if b.rn == 0 then return 1 end
  local x, y = math.fmod(math.fmod(b.rn, b.rd) * 1000, b.rd), b.rd
  while x > 0 do x, y = math.fmod(y, x), x end
  return b.rd / y
end

-- The level at `now`, rounded down to a nano-token: w, f.
local function level_at(b, now)
  if now <= b.t or b.w >= b.c then return b.w, b.f end
  local add = refill(b, now - b.t)
  if bn_cmp(add, need_nanos(b, b.c)) >= 0 then return b.c, 0 end
  return plus(b.w, b.f, add)
end

-- Counts refill up to now without losing anything: full by then becomes
-- (c, 0, now); otherwise t advances to the latest instant at or before now
-- whose refill since t is a whole number of nano-tokens.
local function settle(b, now)
  if now <= b.t then return end
  local elapsed = now - b.t
  if bn_cmp(refill(b, elapsed), need_nanos(b, b.c)) >= 0 then
    b.w, b.f, b.t = b.c, 0, now
    return
  end
  local rest = math.fmod(elapsed, exact_period(b))
  b.w, b.f = plus(b.w, b.f, refill(b, elapsed - rest))
  b.t = now - rest
end

-- A bucket full at now becomes exactly (c, 0), its time not moving back.
local function clamp_full(b, now)
  local w = level_at(b, now)
  if w >= b.c then
    b.w, b.f = b.c, 0
    if now > b.t then b.t = now end
  end
end

-- Switches limits at now: a new rate applies from now on (the level is
-- fixed then, rounded down); tokens are clamped to the new capacity.
-- Returns whether anything changed.
local function reconfigure(b, rn, rd, c, now)
  if b.rn == rn and b.rd == rd and b.c == c then return false end
  if b.rn ~= rn or b.rd ~= rd then
    b.w, b.f = level_at(b, now)
    if now > b.t then b.t = now end
  end
  b.rn, b.rd, b.c = rn, rd, c
  clamp_full(b, now)
  return true
end

-- Microseconds (bignum, at most 2^64 - 1) from now until the bucket holds
-- `level` whole tokens; nil when it never will.
local function micros_until(b, level, now)
  if level > b.c then return nil end
  if level_at(b, now) >= level then return {} end
  local us = micros_for(b, need_nanos(b, level))
  if us == nil then return nil end
  if bn_cmp(us, BN_U64_MAX) > 0 then us = BN_U64_MAX end
  -- from t; from now that is us + t - now (at least 1: not there yet)
  if b.t >= now then
    us = bn_add(us, bn(b.t - now))
  else
    us = bn_sub(us, bn(now - b.t))
  end
  if bn_cmp(us, BN_U64_MAX) > 0 then us = BN_U64_MAX end
  return us
end

-- Microseconds to whole milliseconds, rounded up.
local function ceil_ms(us)
  local x = small(us)
  if x then
    local r = math.fmod(x, 1000)
    local q = (x - r) / 1000
    if r > 0 then q = q + 1 end
    return q
  end
  local q, r = bn_divmod(us, BN_1000)
  if #r > 0 then q = bn_add(q, { 1 }) end
  if bn_cmp(q, BN_I64_MAX) > 0 then q = BN_I64_MAX end
  return bn_num(q)
end

local function whole_tokens(b, now)
  local w = level_at(b, now)
  if w <= 0 then return 0 end
  return w
end

local function reset_after_ms(b, now)
  local us = micros_until(b, b.c, now)
  if us == nil then return -1 end
  return ceil_ms(us)
end

-- Expiry of the key: 'now' (full: delete it), an absolute ms, or 'never'.
local function expiry(b)
  if b.w >= b.c then return 'now' end
  local us = micros_for(b, need_nanos(b, b.c))
  if us == nil then return 'never' end
  local at = bn_divmod(bn_add(bn_add(bn(b.t), us), bn(999)), BN_1000)
  if bn_cmp(at, BN_MAX_EXPIRE_MS) > 0 then return 'never' end
  return bn_num(at)
end

-- The level at now as an exact decimal string (rounded down to 1e-9).
local function tokens_decimal(b, now)
  local w, f = level_at(b, now)
  local sign, whole, frac = '', w, f
  if w < 0 then
    sign = '-'
    if frac > 0 then whole = -w - 1; frac = NANOS - frac else whole = -w end
  end
  if frac == 0 then return sign .. fmt(whole) end
  local digits = string.format('%09d', frac):gsub('0+$', '')
  return sign .. fmt(whole) .. '.' .. digits
end

local function rate_decimal(rn, rd)
  local rem = math.fmod(rn, rd)
  local whole = (rn - rem) / rd
  if rem == 0 then return fmt(whole) end
  local digits = {}
  for _ = 1, 12 do
    rem = rem * 10
    local d = math.floor(rem / rd)
    digits[#digits + 1] = d
    rem = rem - d * rd
    if rem == 0 then break end
  end
  if rem * 2 >= rd then
    local i = #digits
    while true do
      if i == 0 then return fmt(whole + 1) end
      if digits[i] == 9 then
        digits[i] = 0
        i = i - 1
      else
        digits[i] = digits[i] + 1
        break
      end
    end
  end
  while #digits > 0 and digits[#digits] == 0 do digits[#digits] = nil end
  if #digits == 0 then return fmt(whole) end
  return fmt(whole) .. '.' .. table.concat(digits)
end
