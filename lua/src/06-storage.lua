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
