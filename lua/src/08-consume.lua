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
  if name == nil or #name == 0 or #name > MAX_FLOW_NAME then return nil, ERR_FLOW_NAME end
  if args[j + 2] and args[j + 2]:upper() == 'WEIGHT' then
    local w = parse_int(args[j + 3] or '', tostring(MAX_WEIGHT), ERR_WEIGHT)
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
        local ttl = parse_int(args[j + 1] or '', MAX_TTL_MS_STR, ERR_LEASE_TTL)
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
      wait_ms, e = parse_int(args[i + 1] or '', MAX_WAIT_MS_STR, ERR_WAIT)
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
    if wait_ms > DEFAULT_MAX_WAIT_MS then return err(ERR_TOO_LONG) end
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
