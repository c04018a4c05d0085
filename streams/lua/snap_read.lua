-- KEYS: snapshot data. ARGV: field. One part's bytes, or nil.
return redis.call('HGET', KEYS[1], ARGV[1])
