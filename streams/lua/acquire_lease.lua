-- KEYS: the lease key. ARGV: token (the holder), ttl (ms).
-- Takes the lease when no one holds it, refreshes it when this token does: either way its
-- expiry is set to ttl ms from now. Another token's lease is left as it is.
-- Returns {'acquired'|'refreshed', token, ttl} or {'held', holder, its ms left}.
local holder = redis.call('GET', KEYS[1])
if not holder or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {holder and 'refreshed' or 'acquired', ARGV[1], ARGV[2]}
end
return {'held', holder, tostring(redis.call('PTTL', KEYS[1]))}
