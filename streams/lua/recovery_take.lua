-- KEYS: recovery queue. ARGV: sid, now, until.
-- Takes a due entry for one replica: when the session is queued with a score no later than
-- ``now``, its next look moves to ``until`` (so no other replica's sweep takes it before then,
-- and any replica's does after, should this one die with the step half done). Returns
-- {'ok', '1'} when taken, {'ok', '0'} when not queued or not due (another replica has it).
-- ZADD XX INCR 0 reads the score without changing it (ZSCORE is not in the store's ACL).
local score = redis.call('ZADD', KEYS[1], 'XX', 'INCR', 0, ARGV[1])
if not score or tonumber(score) > tonumber(ARGV[2]) then
  return {'ok', '0'}
end
redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
return {'ok', '1'}
