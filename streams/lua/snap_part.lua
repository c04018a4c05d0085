-- KEYS: session, owner's slot set, snapshot data. ARGV: sid, worker, epoch, field, bytes.
local bad = fence(KEYS[1], KEYS[2], ARGV[1], ARGV[2], tonumber(ARGV[3]), true)
if bad then return bad end
redis.call('HSET', KEYS[3], ARGV[4], ARGV[5])
return {'ok'}
