-- Claim a fenced effect before it starts: "effect in progress by fence F, until T".
-- KEYS[1] - the run's lease key
-- KEYS[2] - the run's effects hash: KEY -> "<fence>:<deadline_ms>:<state>",
--           KEY:process -> the claimant's process identity (JSON), KEY:receipt -> JSON,
--           KEY:detail -> why the effect may have happened (a line), while it is ambiguous
-- ARGV[1] - the holder, "<fence>:<token>"
-- ARGV[2] - the effect's step key
-- ARGV[3] - the holder's fence
-- ARGV[4] - how long the claim stands, in milliseconds: the effect's timeout plus a margin for
--           the claimant's clock, which checks the timeout alone
-- ARGV[5] - the holder's process identity (JSON)
-- ARGV[6] - "dead" when the caller proved the earlier claimant's process gone, or the earlier
--           claim's deadline the caller has waited out on its own clock, else ""
-- ARGV[7] - "1" when the receiver drops a repeat of the effect's idempotency key, so an effect
--           that may have happened is repeated under it; else it waits for a decision
-- ARGV[8] - why the effect may have happened, should this claim find that out (a line)
-- ARGV[9] - "1" when the effect is revocable: an operator's cancel may end the run whatever
--           the claim's state, since the application undoes what the effect started (kept as
--           KEY:revocable, which cancel.lua reads)
-- States: claimed (before its irreversible moment), confirmed (the claimant is at or past
-- it), done (a receipt), released (it did not happen), ambiguous (it may have happened and
-- nobody knows), resend (an operator chose to repeat it under its key).
-- returns {1, resumed} when claimed: resumed is 1 when an earlier claimant may have acted,
--         {2, receipt} when an earlier claimant saved its receipt: nothing written,
--         {3, remaining_ms, process, deadline} when an earlier claimant may still act:
--           nothing written, the caller waits for the deadline or proves the claimant dead,
--         {4, fence, detail} when it may have happened and may not be repeated without a
--           decision: the claim is (now) ambiguous, fence the claimant that may have acted,
--         {-1, nil} when the lease has expired, {-2, holder} when another holder owns it.
-- Time is the server's: one clock for every holder's deadline.
local holder = redis.call('GET', KEYS[1])
if holder ~= ARGV[1] then
  return {holder and -2 or -1, holder}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local claim = redis.call('HGET', KEYS[2], ARGV[2])
local resumed = 0
if claim then
  local fence, deadline, state = string.match(claim, '^(%d+):(%d+):(%a+)$')
  if state == 'done' then
    return {2, redis.call('HGET', KEYS[2], ARGV[2] .. ':receipt') or ''}
  end
  local acting = state == 'claimed' or state == 'confirmed'
  if acting and fence ~= ARGV[3] and tonumber(deadline) > now
      and ARGV[6] ~= 'dead' and ARGV[6] ~= deadline then
    return {3, tonumber(deadline) - now,
      redis.call('HGET', KEYS[2], ARGV[2] .. ':process') or '', deadline}
  end
  if state == 'confirmed' or state == 'ambiguous' then
    if ARGV[7] ~= '1' then
      if state == 'confirmed' then
        redis.call('HSET', KEYS[2], ARGV[2], fence .. ':0:ambiguous', ARGV[2] .. ':detail', ARGV[8])
      end
      return {4, tonumber(fence), redis.call('HGET', KEYS[2], ARGV[2] .. ':detail') or ''}
    end
    resumed = 1
  elseif state == 'resend' or state == 'claimed' then
    resumed = 1
  end
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3] .. ':' .. (now + tonumber(ARGV[4])) .. ':claimed',
  ARGV[2] .. ':process', ARGV[5])
if ARGV[9] == '1' then
  redis.call('HSET', KEYS[2], ARGV[2] .. ':revocable', '1')
end
redis.call('HDEL', KEYS[2], ARGV[2] .. ':detail')
return {1, resumed}
