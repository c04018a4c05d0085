-- KEYS: workers hash, the worker's slot set. ARGV: worker, force '1' | '0'.
-- Returns the sessions whose slots were dropped (their generations stay, unslotted).
local w = ARGV[1]
if redis.call('HEXISTS', KEYS[1], 'c:' .. w) == 0 then return {'ok'} end
local held = redis.call('SMEMBERS', KEYS[2])
if #held > 0 and ARGV[2] ~= '1' then
  return {'err', 'no_capacity', w, 'deregister refused: ' .. tostring(#held) .. ' sessions hold slots (drain or force)'}
end
redis.call('DEL', KEYS[2])
redis.call('HDEL', KEYS[1], 'c:' .. w, 'd:' .. w, 'u:' .. w, 'x:' .. w)
local out = {'ok'}
for i = 1, #held do out[#out + 1] = held[i] end
return out
