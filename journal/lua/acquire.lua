-- Take a run's lease if nobody holds it, and fence the new holder.
-- KEYS[1] - the run's lease key (string "<fence>:<token>")
-- KEYS[2] - the run's fence counter
-- KEYS[3] - the run's meta hash
-- ARGV[1] - the caller's random token
-- ARGV[2] - lease time to live, in milliseconds
-- ARGV[3] - now, in milliseconds (the caller's clock, stored in meta)
-- returns {1, fence, starts_without_progress} when acquired,
--         {0, remaining_ms, holder} when another holder's lease is live.
local holder = redis.call('GET', KEYS[1])
if holder then
  return {0, redis.call('PTTL', KEYS[1]), holder}
end
local fence = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], fence .. ':' .. ARGV[1], 'PX', ARGV[2])
redis.call('HINCRBY', KEYS[3], 'starts', 1)
local stalled = redis.call('HINCRBY', KEYS[3], 'starts_without_progress', 1)
redis.call('HSET', KEYS[3], 'fence', fence, 'updated_at', ARGV[3])
redis.call('HSETNX', KEYS[3], 'created_at', ARGV[3])
return {1, fence, stalled}
