-- Delete an ended run's keys, unless it is held or changed since the caller read its meta.
-- KEYS[1] - the run's meta hash
-- KEYS[2] - the run's lease key
-- KEYS[3..] - the run's other keys (steps, fence, signals, effects)
-- ARGV[1] - the meta's updated_at the caller saw
-- ARGV[2..] - the statuses of an ended run that may go
-- returns 1 when deleted; 0 when the run is held, was updated since, or has not ended.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local meta = redis.call('HMGET', KEYS[1], 'updated_at', 'status')
if meta[1] ~= ARGV[1] then
  return 0
end
for i = 2, #ARGV do
  if meta[2] == ARGV[i] then
    redis.call('DEL', unpack(KEYS))
    return 1
  end
end
return 0
