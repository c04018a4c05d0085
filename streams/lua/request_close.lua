-- KEYS: session. ARGV: sid. The user closed the session: no commit may move it again
-- (commit answers 'closed'); its owner, or recovery, releases it for good.
local cur = redis.call('HMGET', KEYS[1], 'e', 'st')
if not cur[1] then return {'err', 'unknown_session', ARGV[1]} end
if cur[2] ~= 'closed' then redis.call('HSET', KEYS[1], 'cr', '1') end
return {'ok'}
