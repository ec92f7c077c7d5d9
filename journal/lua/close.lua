-- End a holder's turn on a run: write its status (and the step records that waited for a
-- write), index it and give the lease back, fenced, in one round trip; optionally not when a
-- signal arrived or a cancel is pending.
-- KEYS[1] - the run's lease key
-- KEYS[2] - the run's meta hash
-- KEYS[3] - the run's signals hash
-- KEYS[4] - the runs index (sorted set: full run id -> last update, ms)
-- KEYS[5] - the due index (sorted set: full run id -> when to look again, ms)
-- KEYS[6] - the run's in-flight hash (see renew.lua): a run given back has no step in flight
-- KEYS[7] - the run's steps hash
-- ARGV[1] - the holder, "<fence>:<token>"
-- ARGV[2] - a signal name: when that signal is already stored, write nothing ("" to skip the check)
-- ARGV[3] - "1" to write nothing when a cancel of the run is pending (a run about to wait)
-- ARGV[4] - the run's full id, "<workflow>:<run_id>", as the indexes hold it
-- ARGV[5] - now, in milliseconds: the run's score in the runs index
-- ARGV[6] - when the run is due again, in milliseconds; "" to take it out of the due index
-- ARGV[7] - how many meta fields to set, n
-- ARGV[8] - how many step records to write, r (records that waited for a write of the run's:
--           a repeatable step's, a settled effect's; Run.unwritten in journal/_run.py)
-- ARGV[9..8+2n] - field, value pairs to set in meta
-- ARGV[9+2n..8+2n+2r] - step key, record pairs, each written first-writer-wins
-- ARGV[9+2n+2r..] - meta fields to delete
-- returns 1 when written, indexed and released,
--         3 when the named signal had already arrived (nothing written: the caller goes on),
--         4 when a cancel is pending (nothing written: the caller cancels the run),
--         -1 when the lease has expired, -2 when another holder owns it (nothing written:
--         the indexes belong to whoever holds the run now).
-- The indexes are the run's shard's (journal/keys.py): sharded, they share the run's hash tag,
-- so this script touches one slot, on one server or a Redis Cluster alike.
local holder = redis.call('GET', KEYS[1])
if holder ~= ARGV[1] then
  return holder and -2 or -1
end
if ARGV[3] == '1' and redis.call('HEXISTS', KEYS[2], 'cancel') == 1 then
  return 4
end
if ARGV[2] ~= '' and redis.call('HEXISTS', KEYS[3], ARGV[2]) == 1 then
  return 3
end
local first_record = 9 + 2 * tonumber(ARGV[7])
local first_delete = first_record + 2 * tonumber(ARGV[8])
if first_record > 9 then
  redis.call('HSET', KEYS[2], unpack(ARGV, 9, first_record - 1))
end
for i = first_record, first_delete - 1, 2 do
  redis.call('HSETNX', KEYS[7], ARGV[i], ARGV[i + 1])
end
if #ARGV >= first_delete then
  redis.call('HDEL', KEYS[2], unpack(ARGV, first_delete))
end
if ARGV[6] == '' then
  redis.call('ZREM', KEYS[5], ARGV[4])
else
  redis.call('ZADD', KEYS[5], ARGV[6], ARGV[4])
end
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[4])
redis.call('DEL', KEYS[1], KEYS[6])
return 1
