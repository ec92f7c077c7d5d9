-- Extend a lease, but only for the holder that owns it (compare-and-PEXPIRE), push the
-- run's due time past the new expiry, and publish the steps the holder is running, all in
-- the same round trip: what operators see in flight is never older than the last renewal.
-- Asked to (ARGV[5]), it also confirms an effect's claim: the synchronous renewal right
-- before an irreversible act and the mark "from here it may have happened" are one trip.
-- An effect nobody has claimed (the opening read none, open.lua) is claimed here, confirmed:
-- until its confirmation it cannot have happened, so no later holder has anything to wait for.
-- KEYS[1] - the run's lease key
-- KEYS[2] - the run's meta hash (only its cancel field is read)
-- KEYS[3] - the run's in-flight hash (step key -> started at, ms): replaced, and expiring
--           with the lease, so a holder that died takes its steps in flight with it
-- KEYS[4] - the run's effects hash (see effect_claim.lua); read only to confirm
-- KEYS[5] - the due index (sorted set: full run id -> when to look again, ms); optional
-- ARGV[1] - the holder, "<fence>:<token>"
-- ARGV[2] - new time to live, in milliseconds
-- ARGV[3] - the run's new due time, in milliseconds (unused without KEYS[5])
-- ARGV[4] - the run's full id, "<workflow>:<run_id>", as the due index holds it
-- ARGV[5] - the effect's step key to confirm, or "" for a renewal alone
-- ARGV[6] - the holder's fence, whose claim ARGV[5] must be (unused without ARGV[5])
-- ARGV[7] - how long a claim taken here stands, ms (see effect_claim.lua ARGV[4]); "0" when
--           the effect must already be this fence's claimed one
-- ARGV[8] - the holder's process identity (JSON), kept with a claim taken here
-- ARGV[9] - "1" when the effect is revocable (see effect_claim.lua ARGV[9])
-- ARGV[10..] - the steps in flight: step key, started at (ms), step key, ...; none is empty
-- returns 1 when extended (and the claim confirmed, if asked), 2 when extended and a cancel
--         of the run is pending (nothing confirmed: the act must not happen),
--         0 when the lease is gone or held by someone else (nothing written),
--         -3 when extended but the claim is not this fence's claimed one, or, asked to
--            claim it, another's claim stands (not confirmed).
-- The due index is the run's shard's (journal/keys.py): sharded, it shares the run's hash tag,
-- so this script touches one slot, on one server or a Redis Cluster alike.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if KEYS[5] then
    redis.call('ZADD', KEYS[5], ARGV[3], ARGV[4])
  end
  redis.call('DEL', KEYS[3])
  if ARGV[10] then
    redis.call('HSET', KEYS[3], unpack(ARGV, 10))
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
  end
  if redis.call('HEXISTS', KEYS[2], 'cancel') == 1 then
    return 2
  end
  if ARGV[5] == '' then
    return 1
  end
  -- From here until a settlement the effect may have happened: a later holder that finds it
  -- confirmed, once its deadline has passed, treats it as ambiguous, never as not done.
  local claim = redis.call('HGET', KEYS[4], ARGV[5])
  if not claim and tonumber(ARGV[7]) > 0 then
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local deadline = now + tonumber(ARGV[7])
    redis.call('HSET', KEYS[4], ARGV[5], ARGV[6] .. ':' .. deadline .. ':confirmed',
      ARGV[5] .. ':process', ARGV[8])
    if ARGV[9] == '1' then
      redis.call('HSET', KEYS[4], ARGV[5] .. ':revocable', '1')
    end
    return 1
  end
  local fence, deadline, state = string.match(claim or '', '^(%d+):(%d+):(%a+)$')
  if fence ~= ARGV[6] or state ~= 'claimed' then
    return -3
  end
  redis.call('HSET', KEYS[4], ARGV[5], fence .. ':' .. deadline .. ':confirmed')
  return 1
end
return 0
