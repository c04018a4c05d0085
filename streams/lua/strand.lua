-- KEYS: recovery queue (sorted set), then one session key per ARGV sid.
-- ARGV: worker, now, sid... Each session still active on the worker owes a recovery of its
-- current epoch: 'rv' records that epoch and the queue holds the session from now (a session
-- already owing this epoch keeps its place). Returns how many were newly queued.
local worker, now, n = ARGV[1], ARGV[2], 0
for i = 1, #KEYS - 1 do
  local sid = ARGV[i + 2]
  local cur = redis.call('HMGET', KEYS[i + 1], 'w', 'e', 'st', 'rv')
  if cur[1] == worker and cur[3] == 'active' and cur[4] ~= cur[2] then
    redis.call('HSET', KEYS[i + 1], 'rv', cur[2])
    redis.call('ZADD', KEYS[1], now, sid)
    n = n + 1
  end
end
return {'ok', tostring(n)}
