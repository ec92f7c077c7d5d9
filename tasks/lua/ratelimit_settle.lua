-- Settle one call's take from a model's rate limits (ratelimit_reserve.lua) with what it used,
-- and learn the limits and their state from the API's anthropic-ratelimit-* headers.
-- KEYS[1] - the limits hash of one API key and model (see ratelimit_reserve.lua)
-- ARGV[1], ARGV[2] - the input tokens taken, and used ("" when unknown: the call failed)
-- ARGV[3], ARGV[4] - the output tokens taken, and used ("" when unknown)
-- ARGV[5] - 1 when the API did not count the request (it refused it), else 0
-- ARGV[6..14] - limit, remaining and reset (ms since the epoch) of requests, input tokens,
--           output tokens, as the headers gave them ("" for a header not given)
-- ARGV[15] - ms since the epoch before which nobody may call (a 429's retry-after), or ""
-- ARGV[16] - the input tokens estimated from the prompt, before scaling (to learn the ratio)
-- ARGV[17] - ms this call waited for room; ARGV[18] - 1 when it was refused (429), else 0
-- ARGV[19] - how long the hash outlives its last use, ms
-- returns 1.
local key = KEYS[1]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + tonumber(time[2]) / 1000

local function give_back(kind, amount)
  local rate = tonumber(redis.call('HGET', key, kind .. ':rate') or '0')
  local tat = tonumber(redis.call('HGET', key, kind .. ':tat') or '0')
  if rate > 0 and tat > 0 and amount ~= 0 then
    redis.call('HSET', key, kind .. ':tat', tostring(tat - amount / rate))
  end
end

local refused = tonumber(ARGV[5]) == 1
give_back('requests', refused and 1 or 0)
if ARGV[2] ~= '' then
  give_back('input', tonumber(ARGV[1]) - tonumber(ARGV[2]))
elseif refused then
  give_back('input', tonumber(ARGV[1]))
end
if ARGV[4] ~= '' then
  give_back('output', tonumber(ARGV[3]) - tonumber(ARGV[4]))
elseif refused then
  give_back('output', tonumber(ARGV[3]))
end

-- The limit is per minute; the bucket may be smaller (the API may enforce it over shorter
-- spans): its size is at least what remains plus what refills until the reset, and at most
-- the limit.
local kinds = {'requests', 'input', 'output'}
for i, kind in ipairs(kinds) do
  local limit = tonumber(ARGV[3 + 3 * i])
  local remaining = tonumber(ARGV[4 + 3 * i])
  local reset = tonumber(ARGV[5 + 3 * i])
  if limit and limit > 0 and remaining and reset then
    local rate = limit / 60000
    local seen = math.floor(remaining + rate * math.max(0, reset - now))
    local cap = math.max(1, seen, tonumber(redis.call('HGET', key, kind .. ':cap') or '0'))
    local tat = math.max(tonumber(redis.call('HGET', key, kind .. ':tat') or '0'), reset)
    redis.call('HSET', key, kind .. ':rate', tostring(rate), kind .. ':cap', math.min(cap, limit),
      kind .. ':tat', tostring(tat), kind .. ':limit', limit,
      kind .. ':remaining', remaining, kind .. ':reset', tostring(reset))
  end
end
if ARGV[15] ~= '' then
  local hold = math.max(tonumber(redis.call('HGET', key, 'hold') or '0'), tonumber(ARGV[15]))
  redis.call('HSET', key, 'hold', tostring(hold))
end
if ARGV[2] ~= '' and tonumber(ARGV[16]) > 0 then
  local seen = tonumber(ARGV[2]) / tonumber(ARGV[16])
  local ratio = tonumber(redis.call('HGET', key, 'input:ratio') or tostring(seen))
  redis.call('HSET', key, 'input:ratio', tostring(0.8 * ratio + 0.2 * seen))
end
if ARGV[4] ~= '' then
  local avg = tonumber(redis.call('HGET', key, 'output:avg') or ARGV[4])
  redis.call('HSET', key, 'output:avg', tostring(0.8 * avg + 0.2 * tonumber(ARGV[4])))
end
redis.call('HSET', key, 'learned', 1)
redis.call('HDEL', key, 'probe')
redis.call('HINCRBY', key, 'calls', 1)
redis.call('HINCRBY', key, 'waited_ms', ARGV[17])
redis.call('HINCRBY', key, 'refused', ARGV[18])
redis.call('PEXPIRE', key, ARGV[19])
return 1
