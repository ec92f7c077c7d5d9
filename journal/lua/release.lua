-- Give a lease back, but only if we still hold it (compare-and-DEL).
-- KEYS[1] - the run's lease key
-- ARGV[1] - the holder, "<fence>:<token>"
-- returns 1 when released, 0 when it had already expired or passed to another holder.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
