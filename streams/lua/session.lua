-- KEYS: session. Returns its flat field/value list (empty when unknown).
return redis.call('HGETALL', KEYS[1])
