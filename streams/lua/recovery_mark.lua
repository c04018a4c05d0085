-- KEYS: recovery queue. ARGV: sid, at ('' to drop the entry).
-- Looks at the session again at ``at`` (only while it is queued), or drops it.
if ARGV[2] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[1])
end
return {'ok'}
