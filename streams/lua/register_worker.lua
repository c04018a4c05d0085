-- KEYS: workers hash. ARGV: worker, capacity. Upsert; never below the slots in use.
local w, cap = ARGV[1], tonumber(ARGV[2])
local used = tonumber(redis.call('HGET', KEYS[1], 'u:' .. w) or '0')
if cap < used then
  return {'err', 'no_capacity', w, 'capacity ' .. tostring(cap) .. ' below ' .. tostring(used) .. ' slots in use'}
end
if redis.call('HEXISTS', KEYS[1], 'c:' .. w) == 0 then
  redis.call('HSET', KEYS[1], 'd:' .. w, '0', 'u:' .. w, '0')
end
redis.call('HSET', KEYS[1], 'c:' .. w, tostring(cap))
return {'ok'}
