-- KEYS: (session, slot set) per item. ARGV: (sid, worker, epoch) per item.
-- Returns one reason per item: 'ok' or the refusal's reason code.
local out = {}
for i = 1, #KEYS / 2 do
  local a = (i - 1) * 3
  local bad = fence(KEYS[2 * i - 1], KEYS[2 * i], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3]), true)
  if bad then out[i] = bad[2] else out[i] = 'ok' end
end
return out
