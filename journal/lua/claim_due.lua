-- Claim the runs whose time has come, so that two sweepers never both enqueue one run.
-- A claimed run is not removed but re-armed at a later time: if the message that wakes it
-- is lost, a later sweep claims it again; a run that starts pushes its own time forward.
-- KEYS[1] - the due index, or one shard of it (sorted set: full run id -> time in milliseconds)
-- ARGV[1] - now, in milliseconds
-- ARGV[2] - the most runs to claim
-- ARGV[3] - when to look at a claimed run again, in milliseconds
-- returns the list of claimed full run ids.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, run in ipairs(due) do
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], run)
end
return due
