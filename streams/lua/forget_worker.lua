-- KEYS: workers hash, the worker's slot set. ARGV: worker, cutoff (Unix seconds).
-- A worker declared down at or before the cutoff (not heard from since: set_up clears the
-- mark) and holding no slot is deregistered. Returns {'ok', '1'} when it was, else {'ok', '0'}.
local w = ARGV[1]
local since = redis.call('HGET', KEYS[1], 'x:' .. w)
if not since or tonumber(since) > tonumber(ARGV[2]) then return {'ok', '0'} end
if #redis.call('SMEMBERS', KEYS[2]) > 0 then return {'ok', '0'} end
redis.call('HDEL', KEYS[1], 'c:' .. w, 'd:' .. w, 'u:' .. w, 'x:' .. w)
return {'ok', '1'}
