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
