-- Take a run's lease if nobody holds it, fence the new holder, and count stalled starts.
-- KEYS[1] - the run's lease key (string "<fence>:<token>")
-- KEYS[2] - the run's fence counter
-- KEYS[3] - the run's meta hash
-- KEYS[4] - the run's steps hash (only its length is read)
-- ARGV[1] - the caller's random token
-- ARGV[2] - lease time to live, in milliseconds
-- ARGV[3] - now, in milliseconds (the caller's clock, stored in meta)
-- ARGV[4] - the caller's process identity (JSON), stored in meta as holder_process
-- ARGV[5] - a holder the caller proved dead ("" for none): its lease is taken over at once
-- returns {1, fence, starts_without_progress} when acquired,
--         {0, remaining_ms, holder, holder_process} when another holder's lease is live,
--         {-1, field} when a counter it must increment is not an integer (nothing is written).
-- A start makes progress when the steps hash grew since the previous start; counting it here,
-- once per start, keeps the per-step record script down to one check and one write.
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[5] then
  local process = redis.call('HGET', KEYS[3], 'holder_process') or ''
  return {0, redis.call('PTTL', KEYS[1]), holder, process}
end
local counters = {
  fence = redis.call('GET', KEYS[2]),
  ['meta.starts'] = redis.call('HGET', KEYS[3], 'starts'),
  ['meta.starts_without_progress'] = redis.call('HGET', KEYS[3], 'starts_without_progress'),
}
for field, value in pairs(counters) do
  if value and not string.match(value, '^%d+$') then
    return {-1, field}
  end
end
local fence = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], fence .. ':' .. ARGV[1], 'PX', ARGV[2])
local recorded = redis.call('HLEN', KEYS[4])
local seen = tonumber(redis.call('HGET', KEYS[3], 'recorded_at_start') or '-1')
local stalled = 1
if recorded == seen then
  stalled = tonumber(redis.call('HGET', KEYS[3], 'starts_without_progress') or '0') + 1
end
redis.call('HINCRBY', KEYS[3], 'starts', 1)
redis.call('HSET', KEYS[3], 'fence', fence, 'updated_at', ARGV[3],
  'recorded_at_start', recorded, 'starts_without_progress', stalled,
  'holder_process', ARGV[4])
redis.call('HSETNX', KEYS[3], 'created_at', ARGV[3])
return {1, fence, stalled}
