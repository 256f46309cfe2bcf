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
