-- KEYS: session, workers hash, target slot set, previous owner's slot set (as guessed).
-- ARGV: sid, expected epoch (0: none yet), target, source worker ('' unless migration),
--       guessed previous owner ('' for none), the opening event's place ('' for none: kept
--       by the first commit as 'op', so that event read again after the close is told apart).
-- e -> e+1 on target iff the stored epoch is e, the source (if given) still owns it, and the
-- target is registered, not draining, not down and has a free slot; the old owner's slot is
-- freed. A session whose user closed it ('cr') is never moved again.
local sid, exp, target, src, guess = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
local cur = redis.call('HMGET', KEYS[1], 'w', 'e', 'st', 'cr')
if cur[3] == 'closed' or cur[4] == '1' then return {'err', 'closed', sid} end
local e = tonumber(cur[2] or '0')
if e == 0 and exp ~= 0 then return {'err', 'unknown_session', sid} end
if exp ~= e then return {'err', 'stale_epoch', sid, tostring(exp), tostring(e)} end
local prev = cur[1] or ''
if src ~= '' and src ~= prev then return {'err', 'not_owner', sid, src, prev} end
if prev ~= guess then return {'retry', prev} end
local wk = KEYS[2]
local cap = redis.call('HGET', wk, 'c:' .. target)
if not cap then return {'err', 'no_capacity', target, 'not registered'} end
if redis.call('HGET', wk, 'd:' .. target) == '1' then return {'err', 'no_capacity', target, 'draining'} end
if redis.call('HEXISTS', wk, 'x:' .. target) == 1 then return {'err', 'no_capacity', target, 'declared down'} end
local used = tonumber(redis.call('HGET', wk, 'u:' .. target) or '0')
local already = redis.call('SISMEMBER', KEYS[3], sid) == 1
if not already and used >= tonumber(cap) then
  return {'err', 'no_capacity', target, 'no free slot (' .. tostring(used) .. '/' .. cap .. ' used)'}
end
if prev ~= '' and prev ~= target and redis.call('SREM', KEYS[4], sid) == 1 then
  redis.call('HINCRBY', wk, 'u:' .. prev, -1)
end
if not already then
  redis.call('SADD', KEYS[3], sid)
  redis.call('HINCRBY', wk, 'u:' .. target, 1)
end
redis.call('HSET', KEYS[1], 'w', target, 'e', tostring(e + 1), 'st', 'active', 'cl', '0')
if e == 0 and (ARGV[6] or '') ~= '' then redis.call('HSET', KEYS[1], 'op', ARGV[6]) end
return {'ok', target, tostring(e + 1)}
