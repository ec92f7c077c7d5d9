-- Mark a claimed effect as at its irreversible moment, as the lease holder that claimed it.
-- KEYS[1] - the run's lease key
-- KEYS[2] - the run's effects hash (see effect_claim.lua)
-- ARGV[1] - the holder, "<fence>:<token>"
-- ARGV[2] - the effect's step key
-- ARGV[3] - the holder's fence
-- returns 1 when confirmed, -1 when the lease has expired, -2 when another holder owns it,
--         -3 when the claim is not this fence's claimed one (nothing written).
-- From here until a settlement the effect may have happened: a later holder that finds it
-- confirmed, once its deadline has passed, treats it as ambiguous, never as not done.
local holder = redis.call('GET', KEYS[1])
if holder ~= ARGV[1] then
  return holder and -2 or -1
end
local claim = redis.call('HGET', KEYS[2], ARGV[2])
if not claim then
  return -3
end
local fence, deadline, state = string.match(claim, '^(%d+):(%d+):(%a+)$')
if fence ~= ARGV[3] or state ~= 'claimed' then
  return -3
end
redis.call('HSET', KEYS[2], ARGV[2], fence .. ':' .. deadline .. ':confirmed')
return 1
