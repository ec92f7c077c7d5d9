-- Write run metadata as the lease holder, optionally unless a signal arrived or a cancel is pending.
-- KEYS[1] - the run's lease key
-- KEYS[2] - the run's meta hash
-- KEYS[3] - the run's signals hash
-- ARGV[1] - the holder, "<fence>:<token>"
-- ARGV[2] - a signal name: when that signal is already stored, write nothing ("" to skip the check)
-- ARGV[3] - "1" to write nothing when a cancel of the run is pending (a run about to wait)
-- ARGV[4..] - field, value pairs to set; a value of "\0" deletes the field
-- returns 1 when written,
--         3 when the named signal had already arrived (nothing written: the caller goes on),
--         4 when a cancel is pending (nothing written: the caller cancels the run),
--         -1 when the lease has expired, -2 when another holder owns it.
local holder = redis.call('GET', KEYS[1])
if not holder then
  return -1
end
if holder ~= ARGV[1] then
  return -2
end
if ARGV[3] == '1' and redis.call('HEXISTS', KEYS[2], 'cancel') == 1 then
  return 4
end
if ARGV[2] ~= '' and redis.call('HEXISTS', KEYS[3], ARGV[2]) == 1 then
  return 3
end
for i = 4, #ARGV, 2 do
  if ARGV[i + 1] == '\0' then
    redis.call('HDEL', KEYS[2], ARGV[i])
  else
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  end
end
return 1
