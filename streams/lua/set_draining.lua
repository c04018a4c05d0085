-- KEYS: workers hash. ARGV: worker, '1' | '0'.
local w = ARGV[1]
if redis.call('HEXISTS', KEYS[1], 'c:' .. w) == 0 then return {'err', 'no_capacity', w, 'not registered'} end
redis.call('HSET', KEYS[1], 'd:' .. w, ARGV[2])
return {'ok'}
