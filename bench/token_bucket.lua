-- The client-side Lua token bucket users paste today, for comparison.
-- Source: /work/shared/seeds/004_a9a59520e1b25cd1.txt ("Rate Limiting and
-- Throttling Async Jobs", section "Distributed rate limiting with Redis"),
-- verbatim except for one line: `now` comes from redis.call('TIME') instead of
-- ARGV[3], as that document's "Clock skew" section advises. ARGV[3] is unused.
-- token_bucket.lua
-- KEYS[1] = bucket key
-- ARGV[1] = capacity (max tokens)
-- ARGV[2] = refill rate (tokens per second)
-- ARGV[3] = now (unix seconds, fractional)
-- ARGV[4] = requested tokens (usually 1)
local capacity   = tonumber(ARGV[1])
local refill     = tonumber(ARGV[2])
local t = redis.call('TIME'); local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local requested  = tonumber(ARGV[4])

local data   = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(data[1])
local ts     = tonumber(data[2])

if tokens == nil then          -- first use: start full
  tokens = capacity
  ts = now
end

-- lazily add the tokens accrued since the last call
local delta = math.max(0, now - ts)
tokens = math.min(capacity, tokens + delta * refill)

local allowed = tokens >= requested
if allowed then
  tokens = tokens - requested
end

redis.call('HMSET', KEYS[1], 'tokens', tokens, 'ts', now)
-- expire idle buckets so memory does not leak
redis.call('EXPIRE', KEYS[1], math.ceil(capacity / refill) * 2)

return allowed and 1 or 0
