-- KEYS: workers hash. Returns its flat field/value list.
return redis.call('HGETALL', KEYS[1])
