-- KEYS: workers hash. ARGV: worker, ts (Unix seconds it was declared down).
-- Marks a registered worker down: no commit targets it until a later sign of life (set_up).
-- Returns {'ok', '1'} when marked, {'ok', '0'} when the worker is not registered.
local w = ARGV[1]
if redis.call('HEXISTS', KEYS[1], 'c:' .. w) == 0 then return {'ok', '0'} end
local since = tonumber(redis.call('HGET', KEYS[1], 'x:' .. w) or '0')
if tonumber(ARGV[2]) > since then redis.call('HSET', KEYS[1], 'x:' .. w, ARGV[2]) end
return {'ok', '1'}
