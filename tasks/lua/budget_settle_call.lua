-- Settle one call's hold with what the call cost: the hold goes and the cost is counted as
-- spent, together. Sent with the record of the step that made the call
-- (journal.send_with_record), so the spend and the answer are written in one round trip.
-- KEYS[1] - the run's usage hash (see budget_reserve.lua)
-- ARGV[1] - the hold's id: its field "r:<id>" goes
-- ARGV[2] - what the call cost, nanodollars
-- returns the run's spend now, nanodollars.
redis.call('HDEL', KEYS[1], 'r:' .. ARGV[1])
return redis.call('HINCRBY', KEYS[1], 'spent', ARGV[2])
