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
    if id > MAX_LEASE_ID then id = 1 end
  end
  lease_seed = id + 1
  if lease_seed > MAX_LEASE_ID then lease_seed = 1 end
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
