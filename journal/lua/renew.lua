-- Extend a lease, but only for the holder that owns it (compare-and-PEXPIRE).
-- KEYS[1] - the run's lease key
-- ARGV[1] - the holder, "<fence>:<token>"
-- ARGV[2] - new time to live, in milliseconds
-- returns 1 when extended, 0 when the lease is gone or held by someone else.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
