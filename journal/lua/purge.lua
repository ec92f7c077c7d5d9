-- Delete an ended run's keys, unless it is held, changed since the caller read its meta, or
-- has an effect that may have happened while the run did not finish.
-- KEYS[1] - the run's meta hash
-- KEYS[2] - the run's lease key
-- KEYS[3] - the run's effects hash (see effect_claim.lua)
-- KEYS[4..] - the run's other keys (steps, fence, signals)
-- ARGV[1] - the meta's updated_at the caller saw
-- ARGV[2..] - the statuses of an ended run that may go
-- returns 1 when deleted; 0 when the run is held, was updated since, or has not ended;
--         2 when it stays because an effect of it is not known to have not happened (its
--         claims on other things, which that effect may have used, must stay too); an
--         effect claimed revocable (its application undid it when the run was cancelled)
--         does not keep it.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local meta = redis.call('HMGET', KEYS[1], 'updated_at', 'status')
if meta[1] ~= ARGV[1] then
  return 0
end
for i = 2, #ARGV do
  if meta[2] == ARGV[i] then
    if meta[2] ~= 'done' then
      local effects = redis.call('HGETALL', KEYS[3])
      for j = 1, #effects, 2 do
        local state = string.match(effects[j + 1], '^%d+:%d+:(%a+)$')
        if state and state ~= 'released' then
          if redis.call('HEXISTS', KEYS[3], effects[j] .. ':revocable') == 0 then
            return 2
          end
        end
      end
    end
    redis.call('DEL', unpack(KEYS))
    return 1
  end
end
return 0
