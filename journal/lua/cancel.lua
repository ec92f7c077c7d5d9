-- Ask a run to stop: at once when nobody holds it, else at its holder's next step boundary.
-- KEYS[1] - the run's lease key
-- KEYS[2] - the run's meta hash
-- KEYS[3] - the run's effects hash (see effect_claim.lua)
-- ARGV[1] - now, in milliseconds
-- ARGV[2] - the reason, a line of text
-- returns 0 when the run does not exist,
--         {1, status} when it has ended already (done or cancelled): nothing written,
--         {4, effect, state} when an effect of the run is claimed or done (it may have
--           happened: the run must finish what follows it), unless it was claimed revocable
--           ("<effect>:revocable": its application undoes it when the run is cancelled, as a
--           provider batch is cancelled): nothing written,
--         2 when a holder is running it: the request is stored, the holder stops at its next
--           step boundary (a dead holder's successor stops before its first step),
--         3 when nobody holds it (waiting, failed, parked, never started): cancelled now.
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
local status = redis.call('HGET', KEYS[2], 'status')
if status == 'done' or status == 'cancelled' then
  return {1, status}
end
local effects = redis.call('HGETALL', KEYS[3])
for i = 1, #effects, 2 do
  local state = string.match(effects[i + 1], '^%d+:%d+:(%a+)$')
  if state and state ~= 'released' then
    if redis.call('HEXISTS', KEYS[3], effects[i] .. ':revocable') == 0 then
      return {4, effects[i], state}
    end
  end
end
redis.call('HSET', KEYS[2], 'cancel', ARGV[2], 'cancel_requested_at', ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 2
end
redis.call('HSET', KEYS[2], 'status', 'cancelled', 'finished_at', ARGV[1], 'updated_at', ARGV[1])
redis.call('HDEL', KEYS[2], 'wait')
return 3
