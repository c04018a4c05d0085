-- KEYS: session, owner's slot set. ARGV: sid, worker, epoch, chunk index | '', input seq | '',
-- the seqs given up on after the gap wait (comma-separated) | ''.
local bad = fence(KEYS[1], KEYS[2], ARGV[1], ARGV[2], tonumber(ARGV[3]), true)
if bad then return bad end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'ci', ARGV[4], 'ce', ARGV[3]) end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'sq', ARGV[5]) end
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'sk', ARGV[6]) end
return {'ok'}
