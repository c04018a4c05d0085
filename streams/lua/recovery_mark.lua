-- KEYS: recovery queue. ARGV: sid, at ('' to drop the entry), expected ('' for any).
-- Looks at the session again at ``at`` (only while it is queued), or drops it; with
-- ``expected``, only while its entry is still the one read (its score): a session queued
-- again meanwhile (its new owner died too: ``strand``) keeps the newer entry.
-- ZADD XX INCR 0 reads the score without changing it (ZSCORE is not in the store's ACL).
-- Returns {'ok', '1'} when marked, {'ok', '0'} when not queued or queued again.
local score = redis.call('ZADD', KEYS[1], 'XX', 'INCR', 0, ARGV[1])
if not score or (ARGV[3] ~= '' and tonumber(score) ~= tonumber(ARGV[3])) then
  return {'ok', '0'}
end
if ARGV[2] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[1])
end
return {'ok', '1'}
