-- Reserve a model call's estimated cost against a run's budget, in the operation that reads
-- the spend, so calls in flight together cannot all count on the same money.
-- KEYS[1] - the run's usage hash: "spent" (settled nanodollars) and one "r:<id>" per call in
--           flight -> "<nanodollars>:<expiry ms>:<holder>" (a reservation nobody settled
--           lapses then; the holder, a process identity, may be absent)
-- ARGV[1] - the reservation's id (one already held under it is replaced, not added to: a
--           batch's creation repeated after a crash holds the same money once)
-- ARGV[2] - its amount, nanodollars
-- ARGV[3] - the budget, nanodollars
-- ARGV[4] - how long the reservation holds unless settled, ms
-- ARGV[5] - the run's spend so far, nanodollars, for a hash that has none yet ("": unknown)
-- ARGV[6] - the reserving process's identity, kept with the reservation
-- ARGV[7..] - values of reservations whose holders the caller proved gone: each one still
--           holding exactly such a value goes, its money returned, whatever its expiry
-- returns {status, spent, reserved}: 1 reserved; 0 it fits only if calls in flight settle
--         for less than they reserved (ask again later); -1 it does not fit even if they
--         cost nothing; -2 the spend is unknown (ask again with ARGV[5]).
local spent = redis.call('HGET', KEYS[1], 'spent')
if not spent then
  if ARGV[5] == '' then
    return {-2, 0, 0}
  end
  spent = ARGV[5]
  redis.call('HSET', KEYS[1], 'spent', spent)
end
spent = tonumber(spent)
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local gone = {}
for i = 7, #ARGV do
  gone[ARGV[i]] = true
end
local reserved = 0
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  if string.sub(fields[i], 1, 2) == 'r:' and fields[i] ~= 'r:' .. ARGV[1] then
    local amount, expiry = string.match(fields[i + 1], '^(%d+):(%d+)')
    if tonumber(expiry) <= now or gone[fields[i + 1]] then
      redis.call('HDEL', KEYS[1], fields[i])
    else
      reserved = reserved + tonumber(amount)
    end
  end
end
local amount = tonumber(ARGV[2])
local budget = tonumber(ARGV[3])
if spent + amount > budget then
  return {-1, spent, reserved}
end
if spent + reserved + amount > budget then
  return {0, spent, reserved}
end
local expiry = now + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'r:' .. ARGV[1], ARGV[2] .. ':' .. expiry .. ':' .. ARGV[6])
return {1, spent, reserved + amount}
