-- Take one call's estimate from a model's rate limits (requests, input and output tokens per
-- minute, each a token bucket kept as GCRA: the time it would be full again), or say how long
-- to wait: every process calling the model with one API key shares these limits.
-- KEYS[1] - the limits hash of one API key and model: "<kind>:cap", "<kind>:rate" (units per
--           ms) and "<kind>:tat" (ms) for kind requests, input and output, learned from the
--           API's headers (ratelimit_settle.lua); "hold" (ms: a 429 said to wait); "probe"
--           (ms: until nothing is learned, one call at a time asks); "input:ratio" and
--           "output:avg" (what calls turned out to use)
-- ARGV[1] - the input tokens estimated from the prompt (scaled here by "input:ratio")
-- ARGV[2] - the output tokens at most (max_tokens; "output:avg" once learned)
-- ARGV[3] - how long a probing call holds the probe, ms
-- ARGV[4] - how long the hash outlives its last use, ms
-- ARGV[5..7] - requests, input and output tokens per minute the operator set (0: learned)
-- returns {1, 0, input, output} when taken (the amounts taken, to settle later),
--         {1, 0, input, output, 1} when taken as the probe: the caller settles it at once,
--           since its answer is what every waiting call waits for,
--         {0, wait ms} when some limit has no room yet (nothing taken), or
--         {0, wait ms, probe ms} when a probe is in flight (nothing taken): asked again within
--           50 ms, by a caller that cannot know when it ends; probe ms is how long it holds at
--           most, for a caller whose own process probes and hears its answer.
local key = KEYS[1]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + tonumber(time[2]) / 1000
local flat = redis.call('HGETALL', key)
local s = {}
for i = 1, #flat, 2 do
  s[flat[i]] = flat[i + 1]
end
local hold = tonumber(s['hold'] or '0')
if hold > now then
  return {0, math.ceil(hold - now)}
end
local input = math.ceil(tonumber(ARGV[1]) * tonumber(s['input:ratio'] or '1'))
local output = tonumber(ARGV[2])
if s['output:avg'] then
  output = math.min(output, math.ceil(tonumber(s['output:avg'])))
end
local overrides = {
  requests = tonumber(ARGV[5]), input = tonumber(ARGV[6]), output = tonumber(ARGV[7])
}
local overridden = overrides.requests > 0 or overrides.input > 0 or overrides.output > 0
if not s['learned'] and not overridden then
  local probe = tonumber(s['probe'] or '0')
  if probe > now then
    local holds = math.ceil(probe - now)
    return {0, math.min(holds, 50), holds}
  end
  redis.call('HSET', key, 'probe', tostring(now + tonumber(ARGV[3])))
  redis.call('PEXPIRE', key, ARGV[4])
  return {1, 0, input, output, 1}
end
local needs = {requests = 1, input = input, output = output}
local wait = 0
local tats = {}
for kind, need in pairs(needs) do
  local cap = tonumber(s[kind .. ':cap'] or '0')
  local rate = tonumber(s[kind .. ':rate'] or '0')
  if overrides[kind] > 0 then
    cap = overrides[kind]
    rate = cap / 60000
  end
  if cap > 0 then
    local tat = math.max(tonumber(s[kind .. ':tat'] or '0'), now)
    local after = tat + math.min(need, cap) / rate
    wait = math.max(wait, after - cap / rate - now)
    tats[kind] = after
  end
end
if wait > 0 then
  return {0, math.ceil(wait)}
end
for kind, tat in pairs(tats) do
  redis.call('HSET', key, kind .. ':tat', tostring(tat))
end
redis.call('PEXPIRE', key, ARGV[4])
return {1, 0, input, output}
