-- KEYS: (session, slot set) per item. ARGV: (sid, worker, epoch, chunk index) per item.
-- Revalidate a coalesced batch and advance each session's released chunk index in the same
-- step: 'ok' when the generation is current and the index is past the stored one (stored
-- now, with the epoch that stored it), or is the stored one stored by this epoch (a repeat
-- whose first reply was lost); 'released' when an earlier owner already released that index
-- (a recovery that recomputes from an older snapshot must not release it twice), else the
-- refusal's code.
local out = {}
for i = 1, #KEYS / 2 do
  local a = (i - 1) * 4
  local skey = KEYS[2 * i - 1]
  local bad = fence(skey, KEYS[2 * i], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3]), true)
  if bad then
    out[i] = bad[2]
  else
    local ci = tonumber(ARGV[a + 4])
    local stored = tonumber(redis.call('HGET', skey, 'ci') or '-1')
    if ci < stored or (ci == stored and redis.call('HGET', skey, 'ce') ~= ARGV[a + 3]) then
      out[i] = 'released'
    else
      redis.call('HSET', skey, 'ci', tostring(ci), 'ce', ARGV[a + 3])
      out[i] = 'ok'
    end
  end
end
return out
