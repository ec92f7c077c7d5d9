-- Extend a lease, but only for the holder that owns it (compare-and-PEXPIRE).
-- KEYS[1] - the run's lease key
-- KEYS[2] - the run's meta hash (only its cancel field is read)
-- ARGV[1] - the holder, "<fence>:<token>"
-- ARGV[2] - new time to live, in milliseconds
-- returns 1 when extended, 2 when extended and a cancel of the run is pending,
--         0 when the lease is gone or held by someone else.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if redis.call('HEXISTS', KEYS[2], 'cancel') == 1 then
    return 2
  end
  return 1
end
return 0
