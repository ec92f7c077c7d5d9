-- An operator's decision on an effect that may have happened: it did, or repeat it.
-- KEYS[1] - the run's lease key
-- KEYS[2] - the run's effects hash (see effect_claim.lua)
-- ARGV[1] - the effect's step key
-- ARGV[2] - "done" (it happened: ARGV[3] is the receipt to hand the run, JSON) or "resend"
--           (repeat it under its idempotency key)
-- ARGV[3] - the receipt, JSON ("" for resend)
-- returns {1} when decided; {0} when the run has no such effect; {2, state} when the effect is
--         not ambiguous (done, released, or still being performed): nothing written.
-- Ambiguous only, or confirmed once its deadline has passed and nobody holds the run (its
-- claimant died where it could not say so): a live claimant may still settle it itself.
local claim = redis.call('HGET', KEYS[2], ARGV[1])
if not claim then
  return {0}
end
local fence, deadline, state = string.match(claim, '^(%d+):(%d+):(%a+)$')
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local abandoned = state == 'confirmed' and tonumber(deadline) <= now
  and redis.call('EXISTS', KEYS[1]) == 0
if state ~= 'ambiguous' and not abandoned then
  return {2, state}
end
redis.call('HSET', KEYS[2], ARGV[1], fence .. ':0:' .. ARGV[2])
if ARGV[2] == 'done' then
  redis.call('HSET', KEYS[2], ARGV[1] .. ':receipt', ARGV[3])
end
return {1}
