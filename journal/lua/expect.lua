-- Expect a delivery of a run: a run that has never opened is armed in the due index, so a
-- message lost before any worker opens it (a worker killed with it reserved, a broker that
-- lost it) is sent again by the due sweep. A run that has opened keeps its own due time.
-- KEYS[1] - the run's meta hash
-- KEYS[2] - the due index (sorted set: full run id -> when to look again, ms), the run's shard
-- ARGV[1] - the run's full id, "<workflow>:<run_id>", as the index holds it
-- ARGV[2] - when to send it again should no delivery have opened it by then, in milliseconds
-- ARGV[3] - the send's arguments (JSON), kept as meta.sent_args for the sweep's send; the
--           run's own (meta.args) are still frozen by its first start, with its defaults
-- returns 1 when the run was armed (or already was, by an earlier send: the earlier time
--           and arguments stay), 0 when it has opened before (nothing written).
if redis.call('HEXISTS', KEYS[1], 'status') == 1 then
  return 0
end
redis.call('HSETNX', KEYS[1], 'sent_args', ARGV[3])
redis.call('ZADD', KEYS[2], 'NX', ARGV[2], ARGV[1])
return 1
