-- KEYS: session, workers hash, owner's slot set, snapshot data.
-- ARGV: sid, worker, epoch, close, retention (ms, for close).
-- Frees the slot of the current generation; close terminates the session for good: its
-- snapshot goes now, and its hash (which refuses any later commit or write as 'closed')
-- expires after the retention.
local sid, w, epoch, close = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1'
local cur = redis.call('HMGET', KEYS[1], 'w', 'e', 'st')
if cur[3] == 'closed' and cur[1] == w and tonumber(cur[2]) == epoch then return {'ok'} end
local bad = fence(KEYS[1], KEYS[3], sid, w, epoch, false)
if bad then return bad end
if redis.call('SREM', KEYS[3], sid) == 1 then redis.call('HINCRBY', KEYS[2], 'u:' .. w, -1) end
if close then
  redis.call('HSET', KEYS[1], 'st', 'closed')
  redis.call('HDEL', KEYS[1], 'sn_id', 'sn_n', 'sn_size', 'sn_sha', 'sn_e', 'sn_ci', 'sn_sq')
  redis.call('DEL', KEYS[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
else
  redis.call('HSET', KEYS[1], 'st', 'suspended')
end
return {'ok'}
