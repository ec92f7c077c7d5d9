-- Drop a purged run from its shard's indexes, unless the run was started again since.
-- KEYS[1] - the runs index (sorted set)
-- KEYS[2] - the due index (sorted set)
-- ARGV[1] - the run, as the indexes name it
-- ARGV[2] - its score in the runs index when it was purged
-- returns 1 when dropped; 0 when the run is back with another score (left listed).
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) ~= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
