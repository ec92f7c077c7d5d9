-- Claim a fenced effect before it starts: "effect in progress by fence F, until T".
-- KEYS[1] - the run's lease key
-- KEYS[2] - the run's effects hash: KEY -> "<fence>:<deadline_ms>:<state>",
--           KEY:process -> the claimant's process identity (JSON), KEY:receipt -> JSON
-- ARGV[1] - the holder, "<fence>:<token>"
-- ARGV[2] - the effect's step key
-- ARGV[3] - the holder's fence
-- ARGV[4] - the effect's timeout, in milliseconds: after it the claimant can no longer act
-- ARGV[5] - the holder's process identity (JSON)
-- ARGV[6] - "1" when the caller proved the earlier claimant's process gone, else ""
-- returns {1, resumed, receipt} when claimed: resumed is 1 when an earlier holder claimed the
--           effect (it may have happened), receipt the one it saved ("" for none),
--         {3, remaining_ms, process} when an earlier holder's claim is still within its
--           timeout (it might still act): nothing written, the caller waits or proves it dead,
--         {-1} when the lease has expired, {-2, holder} when another holder owns it.
-- Time is the server's: one clock for every holder's deadline.
local holder = redis.call('GET', KEYS[1])
if not holder then
  return {-1}
end
if holder ~= ARGV[1] then
  return {-2, holder}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local claim = redis.call('HGET', KEYS[2], ARGV[2])
local resumed = 0
local receipt = ''
if claim then
  local fence, deadline, state = string.match(claim, '^(%d+):(%d+):(%a+)$')
  resumed = 1
  receipt = redis.call('HGET', KEYS[2], ARGV[2] .. ':receipt') or ''
  if state == 'claimed' and fence ~= ARGV[3] and tonumber(deadline) > now and ARGV[6] ~= '1' then
    return {3, tonumber(deadline) - now, redis.call('HGET', KEYS[2], ARGV[2] .. ':process') or ''}
  end
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3] .. ':' .. (now + tonumber(ARGV[4])) .. ':claimed',
  ARGV[2] .. ':process', ARGV[5])
return {1, resumed, receipt}
