-- Settle a claimed effect as the fence that claimed it: it happened, it did not, or unknown.
-- KEYS[1] - the run's lease key
-- KEYS[2] - the run's effects hash (see effect_claim.lua)
-- ARGV[1] - the holder, "<fence>:<token>"
-- ARGV[2] - the effect's step key
-- ARGV[3] - the holder's fence
-- ARGV[4] - "done" (it happened: ARGV[5] is its receipt, JSON), "released" (it did not: the
--           claimant stopped before its irreversible moment) or "ambiguous" (it may have:
--           ARGV[5] says why, a line)
-- ARGV[5] - the receipt, JSON, or the line ("" when released)
-- returns 1 when settled by the lease holder, 2 when settled by a claimant that has lost the
--         lease (a waiting run may have to be woken), -3 when the claim is no longer this
--         fence's to settle (nothing written). Releasing a claim that was never taken (its
--         confirmation, which takes it, never reached the store) writes nothing and answers
--         as a settlement: 1 or 2.
-- The claim's own fence settles it with the lease or without: only the process that claimed
-- it knows what happened under it, and no later holder acts on a claim that is not settled
-- without first waiting out its deadline. Unknown never overwrites what is known.
local claim = redis.call('HGET', KEYS[2], ARGV[2])
if not claim then
  if ARGV[4] ~= 'released' then
    return -3
  end
  return redis.call('GET', KEYS[1]) == ARGV[1] and 1 or 2
end
local fence, deadline, state = string.match(claim, '^(%d+):(%d+):(%a+)$')
if fence ~= ARGV[3] then
  return -3
end
local open = state == 'claimed' or state == 'confirmed'
if not open and not (ARGV[4] ~= 'ambiguous' and (state == 'ambiguous' or state == 'resend')) then
  return -3
end
redis.call('HSET', KEYS[2], ARGV[2], fence .. ':0:' .. ARGV[4])
if ARGV[4] == 'done' then
  redis.call('HSET', KEYS[2], ARGV[2] .. ':receipt', ARGV[5])
  redis.call('HDEL', KEYS[2], ARGV[2] .. ':detail')
elseif ARGV[4] == 'ambiguous' then
  redis.call('HSET', KEYS[2], ARGV[2] .. ':detail', ARGV[5])
else
  redis.call('HDEL', KEYS[2], ARGV[2] .. ':detail')
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return 1
end
return 2
