-- Settle the holds of a step's batches once, with what their results cost: the holds go, the
-- cost is counted as spent. Run again (a replay, a resumed run) it changes nothing, and with
-- no hold of this usage hash to settle (a fork replaying batches its source paid for, whose
-- spend it started from the journal) it counts nothing: a batch is paid for once.
-- KEYS[1] - the run's usage hash (see budget_reserve.lua)
-- ARGV[1] - the settlement's name: "settled:<name>" marks it done
-- ARGV[2] - the holds' id prefix: every "r:<prefix>..." goes
-- ARGV[3] - what the batches' results cost, nanodollars
-- returns 1 when settled now, 0 when it had been already or there was no hold.
if redis.call('HEXISTS', KEYS[1], 'settled:' .. ARGV[1]) == 1 then
  return 0
end
local prefix = 'r:' .. ARGV[2]
local held = 0
local fields = redis.call('HKEYS', KEYS[1])
for i = 1, #fields do
  if string.sub(fields[i], 1, #prefix) == prefix then
    redis.call('HDEL', KEYS[1], fields[i])
    held = held + 1
  end
end
if held == 0 then
  return 0
end
redis.call('HINCRBY', KEYS[1], 'spent', ARGV[3])
redis.call('HSET', KEYS[1], 'settled:' .. ARGV[1], 1)
return 1
