-- TB.MCONSUME's arguments, checked as parse::mconsume_args and the handler
-- check them, in the same order: the request, or nil and the error line.
local function parse_mconsume(args)
  local k = #KEYS
  local triples = 3 * k
  if k == 0 or k > MAX_KEYS or #args < triples then return nil, ERR_NUMKEYS end
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
      if not flow then return nil, used end
      at = at + used
    elseif up == 'WEIGHT' then
      return nil, ERR_WEIGHT
    elseif up == 'LEASE' then
      if at + 2 > #args then return nil, ERR_LEASE_PART end
      local part = parse_int(args[at + 1], tostring(k), ERR_LEASE_PART)
      if not part or part == 0 then return nil, ERR_LEASE_PART end
      local ttl = parse_int(args[at + 2], MAX_TTL_MS_STR, ERR_LEASE_TTL)
      if not ttl or ttl == 0 then return nil, ERR_LEASE_TTL end
      if leased[part] then return nil, ERR_LEASE_TWICE end
      leased[part] = ttl
      any_lease = true
      at = at + 3
      if at <= #args and args[at]:upper() == 'KEEP' then
        kept[part] = true
        at = at + 1
      end
    elseif up == 'RESERVE' and reserve == nil and at + 1 <= #args then
      local ms, e = parse_int(args[at + 1], MAX_WAIT_MS_STR, ERR_WAIT)
      if not ms then return nil, e end
      reserve = ms
      at = at + 2
    elseif up == 'BLOCK' and block == nil and at + 1 <= #args then
      local ms, e = parse_int(args[at + 1], MAX_WAIT_MS_STR, ERR_WAIT)
      if not ms then return nil, e end
      block = ms
      at = at + 2
    elseif up == 'ATMOST' and mode ~= 'atmost' then
      if at + 1 <= #args and args[at + 1]:upper() == 'MIN' then
        if at + 2 > #args then return nil, ERR_MCONSUME_OPTION end
        local e
        chunk, e = parse_chunk(args[at + 2])
        if not chunk then return nil, e end
        minc = chunk
        at = at + 3
      else
        at = at + 1
      end
      mode = 'atmost'
    else
      return nil, ERR_MCONSUME_OPTION
    end
  end
  -- ATMOST grants what is there now: it does not wait, and a lease is never
  -- partial.
  if mode == 'atmost' and reserve ~= nil then return nil, ERR_MCONSUME_OPTION end
  if mode == 'atmost' and any_lease then return nil, ERR_LEASE_MODE end
  if block ~= nil and (reserve ~= nil or mode == 'atmost') then
    return nil, ERR_MCONSUME_BLOCK
  end
  if flow ~= nil and block == nil then return nil, ERR_FLOW_BLOCK end
  if reserve ~= nil then
    if reserve > DEFAULT_MAX_WAIT_MS then return nil, ERR_TOO_LONG end
    mode, max_wait_us = 'reserve', reserve * 1000
  end
  local parts = {}
  for j = 1, k do
    local at = 3 * (j - 1)
    local rn, rd = parse_rate(args[at + 1])
    if not rn then return nil, rd end
    local c, e = parse_int(args[at + 2], MAX_AMOUNT_STR, ERR_CAPACITY)
    if not c then return nil, e end
    local n, e2 = parse_int(args[at + 3], MAX_AMOUNT_STR, ERR_N)
    if not n then return nil, e2 end
    parts[j] = { rn = rn, rd = rd, c = c, n = n }
  end
  -- The largest n: with ATMOST, the parts that ask for it share one grant.
  local big = 0
  for j = 1, k do big = math.max(big, parts[j].n) end
  if chunk ~= nil then
    for j = 1, k do
      if parts[j].n == big and chunk > parts[j].c then return nil, ERR_MIN end
    end
  end
  for a = 1, k do
    for b = 1, a - 1 do
      if KEYS[a] == KEYS[b] then return nil, ERR_DUPLICATE end
    end
  end
  for j = 1, k do
    if leased[j] and parts[j].n == 0 then return nil, ERR_LEASE_N end
  end
  -- BLOCK waits server-side: only the module can hold a reply.
  if block ~= nil then
    if block > DEFAULT_MAX_WAIT_MS then return nil, ERR_TOO_LONG end
    return nil, ERR_CANNOT_BLOCK
  end
  return {
    k = k, mode = mode, max_wait_us = max_wait_us, minc = minc, big = big,
    parts = parts, leased = leased, kept = kept, any_lease = any_lease,
  }
end

local function cmd_mconsume(args)
  local req, perr = parse_mconsume(args)
  if not req then return err(perr) end
  local k, mode, max_wait_us, minc, big = req.k, req.mode, req.max_wait_us, req.minc, req.big
  local parts, leased, kept, any_lease = req.parts, req.leased, req.kept, req.any_lease
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
