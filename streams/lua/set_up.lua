-- KEYS: workers hash. ARGV: worker, ts of a sign of life (heartbeat, start).
-- Clears the down mark when the sign of life is later than the declaration.
local w = ARGV[1]
local since = redis.call('HGET', KEYS[1], 'x:' .. w)
if since and tonumber(ARGV[2]) > tonumber(since) then
  redis.call('HDEL', KEYS[1], 'x:' .. w)
  return {'ok', '1'}
end
return {'ok', '0'}
