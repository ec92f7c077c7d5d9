-- Settle a claimed effect as the holder that claimed it: its receipt, or its abandonment.
-- KEYS[1] - the run's lease key
-- KEYS[2] - the run's effects hash (see effect_claim.lua)
-- ARGV[1] - the holder, "<fence>:<token>"
-- ARGV[2] - the effect's step key
-- ARGV[3] - the holder's fence
-- ARGV[4] - "done" (the effect happened: ARGV[5] is its receipt, JSON) or "released" (the
--           holder stopped before the effect, or failed: it will not act on this claim again)
-- ARGV[5] - the receipt, JSON ("" when released)
-- returns 1 when settled, -1 when the lease has expired, -2 when another holder owns it,
--         -3 when the claim is not this fence's (nothing written).
local holder = redis.call('GET', KEYS[1])
if not holder then
  return -1
end
if holder ~= ARGV[1] then
  return -2
end
local claim = redis.call('HGET', KEYS[2], ARGV[2])
if not claim or string.match(claim, '^(%d+):') ~= ARGV[3] then
  return -3
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3] .. ':0:' .. ARGV[4])
if ARGV[4] == 'done' then
  redis.call('HSET', KEYS[2], ARGV[2] .. ':receipt', ARGV[5])
end
return 1
