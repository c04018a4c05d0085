-- KEYS: the lease key. ARGV: token. Deletes the lease only while this token holds it.
-- Returns {'ok', '1'} when deleted, {'ok', '0'} when another token (or none) held it.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return {'ok', '1'}
end
return {'ok', '0'}
