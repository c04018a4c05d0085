-- KEYS: the logs hash (topic prefix -> the session-events end offset it had reached), the
-- workers hash. ARGV: prefix, end offset now, whether the log still holds a record (1/0),
-- adopt (1/0: take this store as the log's even though it records nothing of it).
-- A store that records the prefix at a higher offset than the log has now serves another log
-- (the topics were made anew): {'behind', recorded}. A store that records nothing of a log
-- that holds records, and no worker, lost what it held (or is another Redis): {'unknown', '0'}.
-- Else the offset is recorded (it only grows) and {'ok', recorded before or '0'} returned.
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local now = tonumber(ARGV[2])
if not cur then
  if ARGV[3] == '1' and ARGV[4] ~= '1' and #redis.call('HKEYS', KEYS[2]) == 0 then
    return {'unknown', '0'}
  end
elseif now < tonumber(cur) then
  return {'behind', cur}
end
if not cur or now > tonumber(cur) then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return {'ok', cur or '0'}
