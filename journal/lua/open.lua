-- Open a run: take its lease, fence the new holder, count stalled starts, announce the run,
-- index it and read its journal, all in one round trip.
-- KEYS[1] - the run's lease key (string "<fence>:<token>")
-- KEYS[2] - the run's fence counter
-- KEYS[3] - the run's meta hash
-- KEYS[4] - the run's steps hash
-- KEYS[5] - the runs index (sorted set: full run id -> last update, ms); opening only
-- KEYS[6] - the due index (sorted set: full run id -> when to look again, ms); opening only
-- KEYS[7] - the run's effects hash (see effect_claim.lua); opening only, read only
-- ARGV[1] - the caller's random token
-- ARGV[2] - lease time to live, in milliseconds
-- ARGV[3] - now, in milliseconds (the caller's clock, stored in meta)
-- ARGV[4] - the caller's process identity (JSON), stored in meta as holder_process
-- ARGV[5] - a holder the caller proved dead ("" for none): its lease is taken over at once
-- ARGV[6] - the most stalled starts before the run is parked; absent to take the lease alone
--           (ARGV[7..] and KEYS[5..] are then unused and nothing else is read or written)
-- ARGV[7] - the run's due time while it is held (lease expiry plus a grace), in milliseconds
-- ARGV[8] - the run's full id, "<workflow>:<run_id>", as the indexes hold it
-- ARGV[9] - the workflow name; ARGV[10] - the run id (stored in meta)
-- ARGV[11] - the run's arguments (JSON), frozen at the first start; "" for none
-- ARGV[12] - "1" to count this start as a delivery (meta.deliveries), else ""
-- ARGV[13] - this delivery's trace context (W3C traceparent), kept as meta.trace unless an
--            earlier delivery's is there; "" (or absent) when it is not traced
-- returns {1, fence, starts_without_progress} when the lease alone was taken,
--         {1, fence, starts_without_progress, meta, steps, effects} when the run was opened:
--           meta is args, wait, created_at, deliveries, starts, trace and every field that is
--           not plain ASCII of the meta hash as it was before this script (flat field, value
--           list), steps the steps hash (flat), effects the effects hash's fields: an effect
--           absent from them was never claimed, so its confirmation may claim it (renew.lua),
--         {0, remaining_ms, holder, holder_process} when another holder's lease is live,
--         {-1, field} when a counter it must increment is not an integer (nothing written
--           but the delivery count),
--         and when opening only:
--         {2, meta} when the run has ended (done or cancelled): it leaves the due index,
--         {5, meta} when the run is parked (nothing written); meta is all of it, flat,
--         {-3, wait} when the stored wait is not one this library wrote (nothing written),
--         {3, fence, starts_without_progress} when the lease was taken but the run has
--           stalled too often: the caller parks it,
--         {4, fence, starts_without_progress} when the lease was taken and a cancel is
--           pending: the caller cancels the run.
-- A start makes progress when the steps hash grew since the previous start; counting it here,
-- once per start, keeps the per-step record script down to one check and one write.
-- The indexes are the run's shard's (journal/keys.py): sharded, they share the run's hash tag,
-- so this script touches one slot, on one server or a Redis Cluster alike.
local opening = ARGV[6] ~= nil
local meta
if opening then
  if ARGV[12] == '1' then
    local deliveries = redis.call('HGET', KEYS[3], 'deliveries')
    if deliveries and not string.match(deliveries, '^%d+$') then
      return {-1, 'meta.deliveries'}
    end
    redis.call('HINCRBY', KEYS[3], 'deliveries', 1)
  end
  local all = redis.call('HGETALL', KEYS[3])
  local status = redis.call('HGET', KEYS[3], 'status')
  if status == 'done' or status == 'cancelled' then
    redis.call('ZREM', KEYS[6], ARGV[8])
    return {2, all}
  end
  if redis.call('HEXISTS', KEYS[3], 'parked') == 1 then
    return {5, all}
  end
  -- Of the rest, only what the caller reads (the arguments, the wait, the creation time, the
  -- counts and the first traced delivery's context, for its span) and any field that
  -- is not plain ASCII, for it to refuse one that is not UTF-8: a whole meta hash per start
  -- would cost the caller more to parse than the script costs to run.
  meta = {}
  for i = 1, #all, 2 do
    local name, value = all[i], all[i + 1]
    if name == 'args' or name == 'wait' or name == 'created_at' or name == 'deliveries'
        or name == 'starts' or name == 'trace'
        or string.find(name, '[\128-\255]')
        or string.find(value, '[\128-\255]') then
      meta[#meta + 1] = name
      meta[#meta + 1] = value
    end
  end
  local wait = redis.call('HGET', KEYS[3], 'wait')
  if wait then
    -- Checked before anything is written: the announcement below clears the field, and a
    -- corrupt one must stay for an operator to see.
    local ok, data = pcall(cjson.decode, wait)
    local readable = ok and type(data) == 'table' and type(data.kind) == 'string'
      and type(data.step) == 'string'
      and (data['until'] == nil or data['until'] == cjson.null or tonumber(data['until']) ~= nil)
    if not readable then
      return {-3, wait}
    end
  end
end
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[5] then
  local process = redis.call('HGET', KEYS[3], 'holder_process') or ''
  return {0, redis.call('PTTL', KEYS[1]), holder, process}
end
local counters = {
  fence = redis.call('GET', KEYS[2]),
  ['meta.starts'] = redis.call('HGET', KEYS[3], 'starts'),
  ['meta.starts_without_progress'] = redis.call('HGET', KEYS[3], 'starts_without_progress'),
}
for field, value in pairs(counters) do
  if value and not string.match(value, '^%d+$') then
    return {-1, field}
  end
end
local fence = redis.call('INCR', KEYS[2])
local lease = fence .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], lease, 'PX', ARGV[2])
local recorded = redis.call('HLEN', KEYS[4])
local seen = tonumber(redis.call('HGET', KEYS[3], 'recorded_at_start') or '-1')
local stalled = 1
if recorded == seen then
  stalled = tonumber(redis.call('HGET', KEYS[3], 'starts_without_progress') or '0') + 1
end
redis.call('HINCRBY', KEYS[3], 'starts', 1)
redis.call('HSET', KEYS[3], 'fence', fence, 'updated_at', ARGV[3],
  'recorded_at_start', recorded, 'starts_without_progress', stalled,
  'holder_process', ARGV[4])
redis.call('HSETNX', KEYS[3], 'created_at', ARGV[3])
if not opening then
  return {1, fence, stalled}
end
if stalled > tonumber(ARGV[6]) then
  return {3, fence, stalled}
end
if redis.call('HEXISTS', KEYS[3], 'cancel') == 1 then
  return {4, fence, stalled}
end
redis.call('HSET', KEYS[3], 'status', 'running', 'workflow', ARGV[9], 'run_id', ARGV[10],
  'holder', lease)
redis.call('HDEL', KEYS[3], 'wait', 'retry_at')
if ARGV[11] ~= '' then
  redis.call('HSETNX', KEYS[3], 'args', ARGV[11])
end
if ARGV[13] and ARGV[13] ~= '' then
  redis.call('HSETNX', KEYS[3], 'trace', ARGV[13])
end
redis.call('ZADD', KEYS[5], ARGV[3], ARGV[8])
redis.call('ZADD', KEYS[6], ARGV[7], ARGV[8])
return {1, fence, stalled, meta, redis.call('HGETALL', KEYS[4]), redis.call('HKEYS', KEYS[7])}
