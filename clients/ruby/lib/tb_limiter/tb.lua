-- tb.lua: the tb module's TB.CONSUME, TB.MCONSUME, TB.REFUND and TB.INFO as
-- one Redis script, for servers that cannot load modules. It mirrors
-- src/bucket.rs and src/parse.rs of the module: same arguments, same errors,
-- same replies, same lazy refill against the server's TIME.
--
-- Call: EVALSHA sha numkeys key [key ...] command arg [arg ...]
--   command TB.CONSUME  : KEYS[1];        args: rate capacity [n] [RESERVE ms | BLOCK ms] [ATMOST [MIN chunk]]
--   command TB.MCONSUME : KEYS[1..k];     args: rate capacity n [rate capacity n ...] [RESERVE ms | ATMOST [MIN chunk]]
--   command TB.REFUND   : KEYS[1];        args: n
--   command TB.RELEASE  : KEYS[1];        args: lease-id [USED n]
--   command TB.INFO     : KEYS[1];        no args
-- (TB.CONSUME also takes LEASE ttl-ms [KEEP], TB.MCONSUME LEASE part ttl-ms [KEEP].)
--
-- Lease ids: the module draws them from the server's CSPRNG, from 1 to
-- 2^53 - 1 (src/lease.rs MAX_ID); a script cannot
-- draw secure randomness, so the caller passes it in. A call that may grant
-- a lease starts its arguments with LEASE-SEED r before the command:
--   EVALSHA sha numkeys key [key ...] LEASE-SEED r command arg [arg ...]
-- with r a random integer from 1 to 2^53 - 1 drawn by the client from a
-- CSPRNG, the module's range. The leases of one call take
-- the ids r, r + 1, ... in key order (wrapping within 1 .. 2^53 - 1),
-- skipping any id the key holds. A lease granted without LEASE-SEED is an
-- error (ERR_LEASE_SEED), so a caller that forgot it never gets a guessable id.
--
-- State: a hash per bucket with integer fields w (whole tokens, negative while
-- reservations hold the bucket in debt), f (nano-tokens, 0 to 999999999),
-- t (server time in microseconds at which w * 1e9 + f nano-tokens is the
-- exact level), rn and rd (the rate as a reduced fraction rn/rd tokens per
-- second) and c (capacity): exactly the module's state. A bucket that handed
-- out leases (src/lease.rs) also has l (the leases held: "id,n,expires_us,keep"
-- joined by ";", by expiry, keep 1 for KEEP; states written before KEEP
-- have li, the last id, and "id,n,expires_us" by id, still read). Like the module, a
-- write settles refill only up to the last instant at which it is a whole
-- number of nano-tokens, so nothing is ever rounded away.
--
-- Lua numbers are doubles, exact for integers up to 2^53. Every product or
-- quotient that can go beyond (refill = elapsed * rn * 1000 / rd, waits =
-- nano-tokens * rd / (rn * 1000), rate parsing) runs on the small exact
-- bignum below, so results match the module's 128-bit arithmetic. What
-- cannot match: a reply or stored value beyond 2^53 (a wait over 285,000
-- years that is not clamped, or a debt of more than 2^53 tokens), and BLOCK,
-- which a script cannot do (it answers the module's error for scripts).

if redis.replicate_commands then
  -- Redis < 7: replicate the writes, not the script, since it reads TIME.
  redis.replicate_commands()
end

local ERR_RATE = 'ERR rate must be a non-negative decimal (10, 0.5, 1e-3) or N/s, N/m, N/h, N/d'
local ERR_RATE_RANGE = 'ERR rate out of range or too precise: supported from about 1e-12 to 9e15 tokens per second'
local ERR_CAPACITY = 'ERR capacity must be an integer from 0 to 9007199254740992'
local ERR_N = 'ERR n must be an integer from 0 to 9007199254740992'
local ERR_WAIT = 'ERR RESERVE and BLOCK take a wait in milliseconds, an integer from 0 to 86400000'
local ERR_OPTION = 'ERR unknown or repeated option: after n, use RESERVE ms, BLOCK ms or ATMOST'
local ERR_ATMOST_WAIT = 'ERR ATMOST cannot be combined with RESERVE or BLOCK'
local ERR_MIN = 'ERR MIN takes a chunk, an integer from 1 to capacity'
local ERR_MIN_ATMOST = 'ERR MIN needs ATMOST'

local ERR_CANNOT_BLOCK = 'ERR BLOCK cannot wait inside MULTI, a script, or on a client that cannot block: use RESERVE and wait on the client'
local ERR_NUMKEYS = 'ERR numkeys must be an integer from 1 to 16 and match the arguments'
local ERR_DUPLICATE = 'ERR a key appears twice in TB.MCONSUME'
local ERR_MOPTION = 'ERR unknown option: TB.MCONSUME takes RESERVE ms, or ATMOST [MIN chunk], and LEASE part ttl-ms'
local ERR_WRONGTYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value'
local ERR_LEASE_TTL = 'ERR LEASE takes a TTL in milliseconds, an integer from 1 to 86400000'
local ERR_LEASE_TWICE = 'ERR LEASE given twice'
local ERR_LEASE_MODE = 'ERR LEASE cannot be combined with RESERVE or ATMOST'
local ERR_MCONSUME_BLOCK = 'ERR BLOCK cannot be combined with RESERVE or ATMOST'
local ERR_FLOW_BLOCK = 'ERR FLOW needs BLOCK'
local ERR_FLOW_NAME = 'ERR FLOW takes a name of 1 to 128 bytes'
local ERR_WEIGHT = 'ERR WEIGHT takes an integer from 1 to 1000000, after FLOW name'
local ERR_LEASE_N = 'ERR LEASE needs n of at least 1'
local ERR_LEASE_FULL = 'ERR the bucket holds 1024 leases already: release some or wait for them to expire'
local ERR_LEASE_ID = 'ERR lease-id must be an integer from 0 to 9007199254740992'
local ERR_LEASE_SEED = 'ERR tb.lua: a lease needs LEASE-SEED r (a random integer from 1 to 2^53 - 1) before the command'
local ERR_USED = 'ERR USED takes the tokens used, an integer from 0 to 9007199254740992'
local ERR_RELEASE_OPTION = 'ERR unknown option: TB.RELEASE takes USED n'
local ERR_LEASE_PART = 'ERR LEASE in TB.MCONSUME takes a part number from 1 to numkeys and a TTL'
local MAX_LEASES = 1024

-- The module's settings at their defaults (tb.max-wait-ms, tb.expire-idle).
local MAX_WAIT_MS = 60000
local ERR_TOO_LONG = 'ERR wait exceeds tb.max-wait-ms (' .. MAX_WAIT_MS .. ')'
local NANOS = 1000000000
local MAX_AMOUNT_STR = '9007199254740992' -- 2^53
local MAX_RATE_NUM = 9007199254740992 -- 2^53
local MAX_RATE_DEN = 1099511627776 -- 2^40

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

---------------------------------------------------------------------------
-- Argument parsing (src/parse.rs).
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

-- Bounds that only out-of-range rates pass (src/parse.rs derives them):
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

---------------------------------------------------------------------------
-- Storage.
---------------------------------------------------------------------------

local FIELDS = { 'w', 'f', 't', 'rn', 'rd', 'c' }

-- The bucket under key: a table, false for a missing key, or nil and the
-- WRONGTYPE error for a key of another type (or a hash that is no bucket).
local function load(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then return false end
  if kind ~= 'hash' then return nil, ERR_WRONGTYPE end
  local v = redis.call('HMGET', key, unpack(FIELDS))
  local b = {}
  for i, name in ipairs(FIELDS) do
    local x = tonumber(v[i])
    if x == nil then return nil, ERR_WRONGTYPE end
    b[name] = x
  end
  return b
end

local function full(rn, rd, c, now)
  return { w = c, f = 0, t = now, rn = rn, rd = rd, c = c }
end

local function copy(b)
  return { w = b.w, f = b.f, t = b.t, rn = b.rn, rd = b.rd, c = b.c }
end

---------------------------------------------------------------------------
-- Leases (src/lease.rs): {held = {{id, n, e, k}, ...}} by expiry (ties in
-- grant order), e the expiry in microseconds, k true for KEEP; blank when
-- none is held. had: the key stored leases when loaded (their fields must
-- go when none is left).
---------------------------------------------------------------------------

local function blank_leases() return { held = {}, had = false } end

local function is_blank(L) return #L.held == 0 end

-- The ids a call's leases take (see LEASE-SEED above): nil without a seed.
local lease_seed = nil
local MAX_LUA_ID = 9007199254740991 -- 2^53 - 1

-- The leases stored under key (whose bucket load() read).
local function load_leases(key)
  local v = redis.call('HMGET', key, 'li', 'l')
  local L = blank_leases()
  if not v[1] and not v[2] then return L end
  L.had = true
  for entry in string.gmatch(v[2] or '', '[^;]+') do
    local id, n, e, k = string.match(entry, '^(%d+),(%d+),(%-?%d+),?([01]?)$')
    L.held[#L.held + 1] = { id = tonumber(id), n = tonumber(n), e = tonumber(e), k = k == '1', at = #L.held }
  end
  if v[1] then
    -- written before KEEP: by id, which was grant order; put in expiry order
    table.sort(L.held, function(x, y)
      if x.e ~= y.e then return x.e < y.e end
      return x.at < y.at
    end)
  end
  return L
end

-- Adds whole tokens to b at now, never above capacity.
local function give_back(b, back, now)
  settle(b, now)
  if b.w + back >= b.c then
    b.w, b.f = b.c, 0
    if now > b.t then b.t = now end
  else
    b.w = b.w + back
  end
end

-- Forgets the leases expired at now, returning to b the tokens of those
-- without KEEP.
local function expire_leases(b, L, now)
  local alive, back = {}, 0
  for _, l in ipairs(L.held) do
    if l.e > now then alive[#alive + 1] = l elseif not l.k then back = back + l.n end
  end
  L.held = alive
  if back > 0 then give_back(b, back, now) end
end

local function holds_id(L, id)
  for _, l in ipairs(L.held) do
    if l.id == id then return true end
  end
  return false
end

-- Grants a lease and returns its id: the next id of the seed that the key
-- does not hold; nil without a seed.
local function grant_lease(L, n, ttl_ms, keep, now)
  if lease_seed == nil then return nil end
  local id = lease_seed
  while holds_id(L, id) do
    id = id + 1
    if id > MAX_LUA_ID then id = 1 end
  end
  lease_seed = id + 1
  if lease_seed > MAX_LUA_ID then lease_seed = 1 end
  local e = now + ttl_ms * 1000
  local at = #L.held + 1
  while at > 1 and L.held[at - 1].e > e do at = at - 1 end
  table.insert(L.held, at, { id = id, n = n, e = e, k = keep })
  return id
end

-- Microseconds (bignum) until b holds `level` whole tokens, counting the
-- tokens of held leases without KEEP as back at their expiry; nil if it
-- never will.
local function lease_micros_until(b, L, level, now)
  local best = micros_until(b, level, now)
  local back = 0
  for _, l in ipairs(L.held) do
    local left = l.e - now
    if left < 0 then left = 0 end
    if best ~= nil and bn_cmp(bn(left), best) >= 0 then break end
    if not l.k then
      back = back + l.n
      local us = micros_until(b, level - back, now)
      if us ~= nil then
        if bn_cmp(bn(left), us) > 0 then us = bn(left) end
        if best == nil or bn_cmp(us, best) < 0 then best = us end
      end
    end
  end
  return best
end

local function lease_reset_after_ms(b, L, now)
  local us = lease_micros_until(b, L, b.c, now)
  if us == nil then return -1 end
  return ceil_ms(us)
end

-- lease::wait_with_leases on a consume reply {allowed, remaining, retry,
-- reset, granted} of the given kind; returns the reply.
local function wait_with_leases(reply, kind, b, L, target, now)
  if #L.held == 0 then return reply end
  reply[4] = lease_reset_after_ms(b, L, now)
  local waiting = kind == 'denied' or kind == 'never' or (kind == 'peek' and reply[3] ~= 0)
  if not waiting or target > b.c then return reply end
  local us = lease_micros_until(b, L, target, now)
  if us ~= nil then reply[3] = ceil_ms(us) end
  return reply
end

-- lease::key_expiry: 'now', an absolute ms or 'never'.
local function lease_expiry(b, L)
  if is_blank(L) then return expiry(b) end
  local held, last_e = 0, L.held[#L.held].e
  for _, l in ipairs(L.held) do
    if not l.k then held = held + l.n end
  end
  local target = b.c - held
  local full_us
  if b.w >= target then
    full_us = bn(b.t)
  else
    local us = micros_for(b, nanos_to(b.w, b.f, target))
    if us == nil then return 'never' end
    full_us = bn_add(bn(b.t), us)
  end
  local at = full_us
  if bn_cmp(bn(last_e), at) > 0 then at = bn(last_e) end
  local ms = bn_divmod(bn_add(at, bn(999)), BN_1000)
  if bn_cmp(ms, BN_MAX_EXPIRE_MS) > 0 then return 'never' end
  ms = bn_num(ms)
  if ms < 1 then ms = 1 end
  return ms
end

-- Writes the bucket, its leases and its expiry; a full bucket that holds
-- no lease is a missing key.
local function commit(key, b, L)
  L = L or blank_leases()
  local at = lease_expiry(b, L)
  if at == 'now' then
    redis.call('DEL', key)
    return
  end
  redis.call('HSET', key, 'w', fmt(b.w), 'f', fmt(b.f), 't', fmt(b.t),
    'rn', fmt(b.rn), 'rd', fmt(b.rd), 'c', fmt(b.c))
  if L.had then redis.call('HDEL', key, 'li', 'l') end
  if not is_blank(L) then
    local parts = {}
    for i, l in ipairs(L.held) do
      local k = '0'
      if l.k then k = '1' end
      parts[i] = fmt(l.id) .. ',' .. fmt(l.n) .. ',' .. fmt(l.e) .. ',' .. k
    end
    redis.call('HSET', key, 'l', table.concat(parts, ';'))
  end
  if at == 'never' then
    redis.call('PERSIST', key)
  else
    redis.call('PEXPIREAT', key, fmt(at))
  end
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function err(msg)
  return redis.error_reply(msg)
end

---------------------------------------------------------------------------
-- Commands.
---------------------------------------------------------------------------

-- bucket::current: the stored bucket (or a full one) brought to now with the
-- caller's limits; returns it and whether the limits changed.
local function current(stored, rn, rd, c, now)
  if not stored then return full(rn, rd, c, now), false end
  local b = copy(stored)
  settle(b, now)
  return b, reconfigure(b, rn, rd, c, now)
end

-- parse::chunk: the chunk after MIN, an integer from 1 to 2^53.
local function parse_chunk(s)
  local v = parse_int(s or '', MAX_AMOUNT_STR, ERR_MIN)
  if not v or v == 0 then return nil, ERR_MIN end
  return v
end

-- bucket::consume: mode is 'all', 'atmost' (with its smallest grant minc)
-- or 'reserve' (with max_wait_us).
-- A take (b.w - x) applies to the settled state at b.t (see bucket.rs take).
local function consume(stored, rn, rd, c, n, mode, max_wait_us, minc, now)
  local b, dirty = current(stored, rn, rd, c, now)
  local have = level_at(b, now)
  local kind, granted, retry
  if n == 0 then
    -- A peek: would a request for one token be served now?
    dirty = false
    local us = micros_until(b, 1, now)
    if us == nil then
      kind, granted, retry = 'peek', 0, -1
    else
      kind, granted, retry = 'peek', 0, ceil_ms(us)
    end
  elseif n > b.c and mode ~= 'atmost' then
    kind, granted, retry = 'never', 0, -1
  elseif have >= n then
    b.w = b.w - n
    dirty = true
    kind, granted, retry = 'allowed', n, 0
  elseif mode == 'atmost' and have >= math.min(minc, n) then
    -- Partial grant: everything whole that is there (less than n, at least
    -- min(minc, n)).
    b.w = b.w - have
    dirty = true
    kind, granted, retry = 'allowed', have, 0
  else
    -- ATMOST waits for its smallest grant; the others for all n.
    local target = n
    if mode == 'atmost' then target = math.min(minc, n) end
    local us = micros_until(b, target, now)
    if us == nil then
      kind, granted, retry = 'never', 0, -1
    elseif mode == 'reserve' and bn_cmp(us, bn(max_wait_us)) <= 0 then
      b.w = b.w - n
      dirty = true
      kind, granted, retry = 'reserved', n, ceil_ms(us)
    else
      kind, granted, retry = 'denied', 0, ceil_ms(us)
    end
  end
  local allowed = 0
  if kind == 'allowed' or kind == 'reserved' or (kind == 'peek' and retry == 0) then
    allowed = 1
  end
  return { allowed, whole_tokens(b, now), retry, reset_after_ms(b, now), granted }, b, dirty, kind
end

-- FLOW name [WEIGHT w] at args[j] (parse::flow_at): the flow's name and the
-- number of arguments it took, or nil and the error.
local function parse_flow(args, j)
  local name = args[j + 1]
  if name == nil or #name == 0 or #name > 128 then return nil, ERR_FLOW_NAME end
  if args[j + 2] and args[j + 2]:upper() == 'WEIGHT' then
    local w = parse_int(args[j + 3] or '', '1000000', ERR_WEIGHT)
    if not w or w == 0 then return nil, ERR_WEIGHT end
    return name, 4
  end
  return name, 2
end

local function cmd_consume(args)
  if #args < 2 then
    return err("ERR wrong number of arguments for 'tb.consume' command")
  end
  local rn, rd = parse_rate(args[1])
  if not rn then return err(rd) end
  local c, e = parse_int(args[2], MAX_AMOUNT_STR, ERR_CAPACITY)
  if not c then return err(e) end
  -- FLOW name [WEIGHT w], anywhere after capacity (parse::split_flow): only
  -- checked here, since only the module can wait in a queue.
  local flow = nil
  do
    local rest, j = { args[1], args[2] }, 3
    while args[j] do
      local up = args[j]:upper()
      if up == 'FLOW' then
        if flow ~= nil then return err(ERR_OPTION) end
        local used
        flow, used = parse_flow(args, j)
        if not flow then return err(used) end
        j = j + used
      elseif up == 'WEIGHT' then
        return err(ERR_WEIGHT)
      else
        rest[#rest + 1] = args[j]
        j = j + 1
      end
    end
    args = rest
  end
  -- LEASE ttl-ms [KEEP], anywhere after capacity (parse::split_lease)
  local lease_ttl, lease_keep = nil, false
  do
    local rest, j = { args[1], args[2] }, 3
    while args[j] do
      if args[j]:upper() == 'LEASE' then
        if lease_ttl ~= nil then return err(ERR_LEASE_TWICE) end
        local ttl = parse_int(args[j + 1] or '', '86400000', ERR_LEASE_TTL)
        if not ttl or ttl == 0 then return err(ERR_LEASE_TTL) end
        lease_ttl = ttl
        j = j + 2
        if args[j] and args[j]:upper() == 'KEEP' then
          lease_keep = true
          j = j + 1
        end
      else
        rest[#rest + 1] = args[j]
        j = j + 1
      end
    end
    args = rest
  end
  -- [n] [RESERVE ms | BLOCK ms] [ATMOST [MIN chunk]]
  local n, atmost, wait, wait_ms, minc = 1, false, nil, 0, nil
  local i = 3
  local first = args[i]
  if first then
    local up = first:upper()
    if up ~= 'ATMOST' and up ~= 'MIN' and up ~= 'RESERVE' and up ~= 'BLOCK' then
      n, e = parse_int(first, MAX_AMOUNT_STR, ERR_N)
      if not n then return err(e) end
      i = i + 1
    end
  end
  while args[i] do
    local up = args[i]:upper()
    if up == 'ATMOST' and not atmost then
      atmost = true
    elseif up == 'MIN' and minc == nil then
      minc, e = parse_chunk(args[i + 1])
      if not minc then return err(e) end
      i = i + 1
    elseif (up == 'RESERVE' or up == 'BLOCK') and wait == nil then
      wait_ms, e = parse_int(args[i + 1] or '', '86400000', ERR_WAIT)
      if not wait_ms then return err(e) end
      wait = up
      i = i + 1
    else
      return err(ERR_OPTION)
    end
    i = i + 1
  end
  if atmost and wait ~= nil then return err(ERR_ATMOST_WAIT) end
  if minc ~= nil and not atmost then return err(ERR_MIN_ATMOST) end
  if minc ~= nil and minc > c then return err(ERR_MIN) end
  if lease_ttl ~= nil then
    if atmost or wait == 'RESERVE' then return err(ERR_LEASE_MODE) end
    if n == 0 then return err(ERR_LEASE_N) end
  end
  if flow ~= nil and wait ~= 'BLOCK' then return err(ERR_FLOW_BLOCK) end
  local mode = 'all'
  if wait ~= nil then
    if wait_ms > MAX_WAIT_MS then return err(ERR_TOO_LONG) end
    mode = 'reserve'
  elseif atmost then
    mode = 'atmost'
  end
  if wait == 'BLOCK' then return err(ERR_CANNOT_BLOCK) end
  local now = now_us()
  local stored, lerr = load(KEYS[1])
  if stored == nil then return err(lerr) end
  local L = blank_leases()
  if stored then
    L = load_leases(KEYS[1])
    expire_leases(stored, L, now)
  end
  if lease_ttl ~= nil and #L.held >= MAX_LEASES then return err(ERR_LEASE_FULL) end
  local reply, b, dirty, kind = consume(stored or nil, rn, rd, c, n, mode, wait_ms * 1000, minc or 1, now)
  local lease_id = 0
  if lease_ttl ~= nil and kind == 'allowed' then
    lease_id = grant_lease(L, n, lease_ttl, lease_keep, now)
    if lease_id == nil then return err(ERR_LEASE_SEED) end
  end
  -- what a denial waits for: 1 for a peek, the chunk (at most n) for ATMOST
  local target = n
  if n == 0 then target = 1 elseif atmost then target = math.min(minc or 1, n) end
  reply = wait_with_leases(reply, kind, b, L, target, now)
  if dirty then commit(KEYS[1], b, L) end
  if lease_ttl ~= nil then reply[6] = lease_id end
  return reply
end

local function cmd_mconsume(args)
  local k = #KEYS
  local triples = 3 * k
  if k == 0 or k > 16 or #args < triples then return err(ERR_NUMKEYS) end
  local mode, max_wait_us, minc = 'all', 0, 1
  local chunk = nil
  local leased, kept, any_lease, reserve, block = {}, {}, false, nil, nil
  local flow = nil
  local at = triples + 1
  while at <= #args do
    local up = args[at]:upper()
    if up == 'FLOW' and flow == nil then
      local used
      flow, used = parse_flow(args, at)
      if not flow then return err(used) end
      at = at + used
    elseif up == 'WEIGHT' then
      return err(ERR_WEIGHT)
    elseif up == 'LEASE' then
      if at + 2 > #args then return err(ERR_LEASE_PART) end
      local part = parse_int(args[at + 1], tostring(k), ERR_LEASE_PART)
      if not part or part == 0 then return err(ERR_LEASE_PART) end
      local ttl = parse_int(args[at + 2], '86400000', ERR_LEASE_TTL)
      if not ttl or ttl == 0 then return err(ERR_LEASE_TTL) end
      if leased[part] then return err(ERR_LEASE_TWICE) end
      leased[part] = ttl
      any_lease = true
      at = at + 3
      if at <= #args and args[at]:upper() == 'KEEP' then
        kept[part] = true
        at = at + 1
      end
    elseif up == 'RESERVE' and reserve == nil and at + 1 <= #args then
      local ms, e = parse_int(args[at + 1], '86400000', ERR_WAIT)
      if not ms then return err(e) end
      reserve = ms
      at = at + 2
    elseif up == 'BLOCK' and block == nil and at + 1 <= #args then
      local ms, e = parse_int(args[at + 1], '86400000', ERR_WAIT)
      if not ms then return err(e) end
      block = ms
      at = at + 2
    elseif up == 'ATMOST' and mode ~= 'atmost' then
      if at + 1 <= #args and args[at + 1]:upper() == 'MIN' then
        if at + 2 > #args then return err(ERR_MOPTION) end
        local e
        chunk, e = parse_chunk(args[at + 2])
        if not chunk then return err(e) end
        minc = chunk
        at = at + 3
      else
        at = at + 1
      end
      mode = 'atmost'
    else
      return err(ERR_MOPTION)
    end
  end
  -- ATMOST grants what is there now: it does not wait, and a lease is never
  -- partial.
  if mode == 'atmost' and reserve ~= nil then return err(ERR_MOPTION) end
  if mode == 'atmost' and any_lease then return err(ERR_LEASE_MODE) end
  if block ~= nil and (reserve ~= nil or mode == 'atmost') then
    return err(ERR_MCONSUME_BLOCK)
  end
  if flow ~= nil and block == nil then return err(ERR_FLOW_BLOCK) end
  if reserve ~= nil then
    if reserve > MAX_WAIT_MS then return err(ERR_TOO_LONG) end
    mode, max_wait_us = 'reserve', reserve * 1000
  end
  local parts = {}
  for j = 1, k do
    local at = 3 * (j - 1)
    local rn, rd = parse_rate(args[at + 1])
    if not rn then return err(rd) end
    local c, e = parse_int(args[at + 2], MAX_AMOUNT_STR, ERR_CAPACITY)
    if not c then return err(e) end
    local n, e2 = parse_int(args[at + 3], MAX_AMOUNT_STR, ERR_N)
    if not n then return err(e2) end
    parts[j] = { rn = rn, rd = rd, c = c, n = n }
  end
  -- The largest n: with ATMOST, the parts that ask for it share one grant.
  local big = 0
  for j = 1, k do big = math.max(big, parts[j].n) end
  if chunk ~= nil then
    for j = 1, k do
      if parts[j].n == big and chunk > parts[j].c then return err(ERR_MIN) end
    end
  end
  for a = 1, k do
    for b = 1, a - 1 do
      if KEYS[a] == KEYS[b] then return err(ERR_DUPLICATE) end
    end
  end
  for j = 1, k do
    if leased[j] and parts[j].n == 0 then return err(ERR_LEASE_N) end
  end
  -- BLOCK waits server-side: only the module can hold a reply.
  if block ~= nil then
    if block > MAX_WAIT_MS then return err(ERR_TOO_LONG) end
    return err(ERR_CANNOT_BLOCK)
  end
  local now = now_us()
  local leases = {}
  for j = 1, k do
    local stored, lerr = load(KEYS[j])
    if stored == nil then return err(lerr) end
    leases[j] = blank_leases()
    if stored then
      leases[j] = load_leases(KEYS[j])
      expire_leases(stored, leases[j], now)
    end
    parts[j].stored = stored
  end
  for j = 1, k do
    if leased[j] and #leases[j].held >= MAX_LEASES then return err(ERR_LEASE_FULL) end
  end
  -- A lease is never reserved: a leased part short now denies the call.
  local short = {}
  for j = 1, k do
    if leased[j] then
      local p = parts[j]
      local _, _, _, kind = consume(p.stored, p.rn, p.rd, p.c, p.n, 'all', 0, 1, now)
      if kind ~= 'allowed' then short[#short + 1] = j end
    end
  end
  if #short > 0 then mode = 'all' end
  -- bucket::consume_all (a part with n = 0 is a peek: it needs one token)
  local buckets, dirty = {}, {}
  local wait = {} -- bignum microseconds; nil once any part can never succeed
  local share = big -- ATMOST: the grant every quantity part can give now
  for j = 1, k do
    local p = parts[j]
    local b, changed = current(p.stored, p.rn, p.rd, p.c, now)
    local this = nil
    if mode == 'atmost' and p.n == big and big > 0 then
      share = math.min(share, whole_tokens(b, now))
      this = micros_until(b, math.min(minc, p.n), now)
    elseif p.n <= b.c then
      this = micros_until(b, math.max(p.n, 1), now)
    end
    if wait ~= nil and this ~= nil then
      if bn_cmp(this, wait) > 0 then wait = this end
    else
      wait = nil
    end
    buckets[j] = b
    dirty[j] = changed
  end
  local allowed, retry
  if wait == nil then
    allowed, retry = 0, -1
  elseif #wait == 0 then
    allowed, retry = 1, 0
  elseif mode == 'reserve' and bn_cmp(wait, bn(max_wait_us)) <= 0 then
    allowed, retry = 1, ceil_ms(wait)
  else
    allowed, retry = 0, ceil_ms(wait)
  end
  local granted = 0
  if allowed == 1 then
    granted = big
    if mode == 'atmost' then granted = share end
    for j = 1, k do
      local take = parts[j].n
      if mode == 'atmost' and take == big then take = granted end
      if take > 0 then
        buckets[j].w = buckets[j].w - take
        dirty[j] = true
      end
    end
  end
  local any_held = false
  for j = 1, k do
    if #leases[j].held > 0 then any_held = true end
  end
  if (allowed == 0 and any_held) or #short > 0 then
    -- The wait counting held leases' expiry: over the short leased parts,
    -- or over every part.
    local which = short
    if #which == 0 then
      which = {}
      for j = 1, k do which[j] = j end
    end
    local w = {}
    for _, j in ipairs(which) do
      local p, b = parts[j], buckets[j]
      -- what the part needs (bucket::MultiOutcome::need)
      local need = math.max(p.n, 1)
      if mode == 'atmost' and p.n == big and big > 0 then need = math.min(minc, p.n) end
      local us = nil
      if need <= b.c then us = lease_micros_until(b, leases[j], need, now) end
      if us == nil then w = nil break end
      if bn_cmp(us, w) > 0 then w = us end
    end
    if w == nil then retry = -1 else retry = ceil_ms(w) end
  end
  local ids = {}
  for j = 1, k do
    ids[j] = 0
    if allowed == 1 and leased[j] then
      ids[j] = grant_lease(leases[j], parts[j].n, leased[j], kept[j] or false, now)
      if ids[j] == nil then return err(ERR_LEASE_SEED) end
    end
  end
  local reply = { allowed, retry }
  for j = 1, k do
    if dirty[j] then commit(KEYS[j], buckets[j], leases[j]) end
    reply[#reply + 1] = whole_tokens(buckets[j], now)
  end
  if mode == 'atmost' then reply[#reply + 1] = granted end
  if any_lease then
    for j = 1, k do reply[#reply + 1] = ids[j] end
  end
  return reply
end

local function cmd_refund(args)
  if #args ~= 1 then
    return err("ERR wrong number of arguments for 'tb.refund' command")
  end
  local n, e = parse_int(args[1], MAX_AMOUNT_STR, ERR_N)
  if not n then return err(e) end
  local now = now_us()
  local stored, lerr = load(KEYS[1])
  if stored == nil then return err(lerr) end
  if not stored then return false end
  local L = load_leases(KEYS[1])
  expire_leases(stored, L, now)
  local b = copy(stored)
  settle(b, now)
  b.w = b.w + n
  clamp_full(b, now)
  if n > 0 then commit(KEYS[1], b, L) end
  return whole_tokens(b, now)
end

local function cmd_release(args)
  if #args ~= 1 and #args ~= 3 then
    return err("ERR wrong number of arguments for 'tb.release' command")
  end
  local id = parse_int(args[1], MAX_AMOUNT_STR, ERR_LEASE_ID)
  if not id then return err(ERR_LEASE_ID) end
  local used = nil
  if #args == 3 then
    if args[2]:upper() ~= 'USED' then return err(ERR_RELEASE_OPTION) end
    local e
    used, e = parse_int(args[3], MAX_AMOUNT_STR, ERR_USED)
    if not used then return err(e) end
  end
  local now = now_us()
  local stored, lerr = load(KEYS[1])
  if stored == nil then return err(lerr) end
  if not stored then return false end
  local L = load_leases(KEYS[1])
  local b = copy(stored)
  expire_leases(b, L, now)
  local at = nil
  for i, l in ipairs(L.held) do
    if l.id == id then at = i end
  end
  if at == nil then return false end
  local lease = table.remove(L.held, at)
  local returned = lease.n - (used or 0)
  if returned >= 0 then
    -- what went back: the increase of the level after the cap, rounded down
    settle(b, now)
    if b.w + returned >= b.c then
      returned = b.c - b.w
      if b.f > 0 then returned = returned - 1 end
    end
    give_back(b, lease.n - (used or 0), now)
  else
    settle(b, now)
    b.w = b.w + returned
  end
  commit(KEYS[1], b, L)
  return returned
end

local function cmd_info(args)
  if #args ~= 0 then
    return err("ERR wrong number of arguments for 'tb.info' command")
  end
  local now = now_us()
  local stored, lerr = load(KEYS[1])
  if stored == nil then return err(lerr) end
  if not stored then return false end
  local L = load_leases(KEYS[1])
  expire_leases(stored, L, now)
  local t = stored.t
  local updated_ms = (t - math.fmod(t, 1000)) / 1000
  if math.fmod(t, 1000) < 0 then updated_ms = updated_ms - 1 end
  local reply = {
    'tokens', tokens_decimal(stored, now),
    'capacity', stored.c,
    'rate', rate_decimal(stored.rn, stored.rd),
    'updated_at_ms', updated_ms,
    'reset_after_ms', lease_reset_after_ms(stored, L, now),
    'ttl_ms', redis.call('PTTL', KEYS[1]),
  }
  if not is_blank(L) then
    local left = L.held[1].e - now
    if left < 0 then left = 0 end
    local next_ms = ceil_ms(bn(left))
    reply[#reply + 1] = 'leases'
    reply[#reply + 1] = #L.held
    reply[#reply + 1] = 'next_lease_expiry_ms'
    reply[#reply + 1] = next_ms
  end
  return reply
end

local COMMANDS = {
  ['TB.CONSUME'] = cmd_consume,
  ['TB.MCONSUME'] = cmd_mconsume,
  ['TB.REFUND'] = cmd_refund,
  ['TB.RELEASE'] = cmd_release,
  ['TB.INFO'] = cmd_info,
}

local first = 1
if (ARGV[1] or ''):upper() == 'LEASE-SEED' then
  local seed = parse_int(ARGV[2] or '', '9007199254740991', ERR_LEASE_SEED)
  if not seed or seed == 0 then return err(ERR_LEASE_SEED) end
  lease_seed = seed
  first = 3
end
local handler = COMMANDS[(ARGV[first] or ''):upper()]
if not handler then
  return err('ERR tb.lua: the first argument must be TB.CONSUME, TB.MCONSUME, TB.REFUND, TB.RELEASE or TB.INFO')
end
local args = {}
for i = first + 1, #ARGV do args[i - first] = ARGV[i] end
return handler(args)
