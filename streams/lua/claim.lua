-- KEYS: session, owner's slot set. ARGV: sid, worker, epoch. Marks the generation claimed.
local bad = fence(KEYS[1], KEYS[2], ARGV[1], ARGV[2], tonumber(ARGV[3]), true)
if bad then return bad end
redis.call('HSET', KEYS[1], 'cl', '1')
return {'ok'}
