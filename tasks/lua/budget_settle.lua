-- Settle the reservations of a step's batches once, with what their results cost: the
-- reservations go, the cost is counted as spent. Run again (a replay, a resumed run) it
-- changes nothing, so a batch is paid for once in the spend however often it is settled.
-- KEYS[1] - the run's usage hash (see budget_reserve.lua)
-- ARGV[1] - the settlement's name: "settled:<name>" marks it done
-- ARGV[2] - the reservations' id prefix: every "r:<prefix>..." goes
-- ARGV[3] - what the batches' results cost, nanodollars
-- returns 1 when settled now, 0 when it had been already.
if redis.call('HSETNX', KEYS[1], 'settled:' .. ARGV[1], 1) == 0 then
  return 0
end
redis.call('HINCRBY', KEYS[1], 'spent', ARGV[3])
local fields = redis.call('HKEYS', KEYS[1])
local prefix = 'r:' .. ARGV[2]
for i = 1, #fields do
  if string.sub(fields[i], 1, #prefix) == prefix then
    redis.call('HDEL', KEYS[1], fields[i])
  end
end
return 1
