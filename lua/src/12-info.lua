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
