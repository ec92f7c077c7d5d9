-- Record one completed step, fenced: only the current lease holder may write, first write wins.
-- KEYS[1] - the run's lease key
-- KEYS[2] - the run's steps hash
-- KEYS[3] - the run's meta hash (only its cancel field is read)
-- ARGV[1] - the holder, "<fence>:<token>"
-- ARGV[2] - the step key (hash field)
-- ARGV[3] - the step record, JSON
-- ARGV[4..] - earlier steps' records that waited for this write (a repeatable step's, a settled
--             effect's: Run.unwritten): step key, record pairs, each first-writer-wins, before it
-- returns 1 when recorded (a bare integer: the common reply is the cheapest to parse),
--         3 when recorded and a cancel of the run is pending (the run stops before its next step),
--         {2, existing_record} when the step was already recorded (the caller adopts it),
--         {-1, nil} when the lease has expired (nobody holds it),
--         {-2, holder} when another holder owns the lease (fenced).
local holder = redis.call('GET', KEYS[1])
if holder ~= ARGV[1] then
  return {holder and -2 or -1, holder}
end
for i = 4, #ARGV, 2 do
  redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1])
end
if redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[3]) == 0 then
  return {2, redis.call('HGET', KEYS[2], ARGV[2])}
end
if redis.call('HEXISTS', KEYS[3], 'cancel') == 1 then
  return 3
end
return 1
