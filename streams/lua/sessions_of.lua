-- KEYS: a worker's slot set. The sessions holding slots on it.
return redis.call('SMEMBERS', KEYS[1])
