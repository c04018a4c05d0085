-- KEYS: recovery queue. ARGV: now, limit.
-- Returns {queued, sid, at, sid, at, ...}: the queue's size, then the entries due by now,
-- earliest first.
local out = {tostring(redis.call('ZCARD', KEYS[1]))}
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
for i = 1, #due do out[#out + 1] = due[i] end
return out
