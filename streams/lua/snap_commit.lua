-- KEYS: session, owner's slot set, snapshot data.
-- ARGV: sid, worker, epoch, snap id, parts, size, sha256, chunk index | '', input seq | ''.
-- Publishes the manifest once every part is present, and drops every other snapshot's parts.
local bad = fence(KEYS[1], KEYS[2], ARGV[1], ARGV[2], tonumber(ARGV[3]), true)
if bad then return bad end
local id, n = ARGV[4], tonumber(ARGV[5])
for i = 0, n - 1 do
  if redis.call('HEXISTS', KEYS[3], id .. ':' .. tostring(i)) == 0 then
    return {'err', 'missing_part', ARGV[1], id, tostring(i)}
  end
end
local prefix = id .. ':'
local fields = redis.call('HKEYS', KEYS[3])
for i = 1, #fields do
  if string.sub(fields[i], 1, #prefix) ~= prefix then redis.call('HDEL', KEYS[3], fields[i]) end
end
redis.call('HSET', KEYS[1], 'sn_id', id, 'sn_n', ARGV[5], 'sn_size', ARGV[6], 'sn_sha', ARGV[7],
  'sn_e', ARGV[3], 'sn_ci', ARGV[8], 'sn_sq', ARGV[9])
return {'ok'}
