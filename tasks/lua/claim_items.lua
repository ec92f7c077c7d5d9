-- Claim a run's unseen items, in the same atomic step that reads the seen set: a week that
-- marks the items seen (and drops their claims) lands wholly before or wholly after it, so
-- an item is never both covered by an earlier digest and claimed again.
-- KEYS[1] - the seen set: ids of items earlier digests covered
-- KEYS[2] - the claims hash: item id -> the run ("digest:<run_id>") holding it
-- ARGV[1] - the claimant, "digest:<run_id>"
-- ARGV[2] - "1" to claim each unseen, unheld item; "0" to only read (a preview)
-- ARGV[3..] - the item ids
-- returns one reply per id, in order: 0 when seen, else the item's holder now (the claimant
-- when it got the item), or nil when unheld (a preview only).
local claim = ARGV[2] == '1'
local replies = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('SISMEMBER', KEYS[1], id) == 1 then
    replies[#replies + 1] = 0
  else
    if claim then
      redis.call('HSETNX', KEYS[2], id, ARGV[1])
    end
    replies[#replies + 1] = redis.call('HGET', KEYS[2], id)
  end
end
return replies
