-- Shared by every script that checks a generation; prepended at load time.
-- fence(): nil when (worker, epoch) is the session's current generation (and, with
-- need_slot, still holds its slot in slot_key), else an error reply.
local function fence(session_key, slot_key, sid, worker, epoch, need_slot)
  local cur = redis.call('HMGET', session_key, 'w', 'e', 'st')
  if not cur[2] then return {'err', 'unknown_session', sid} end
  if cur[3] == 'closed' then return {'err', 'closed', sid} end
  local e = tonumber(cur[2])
  if epoch ~= e then return {'err', 'stale_epoch', sid, tostring(epoch), tostring(e)} end
  if worker ~= cur[1] then return {'err', 'not_owner', sid, worker, cur[1]} end
  if need_slot and redis.call('SISMEMBER', slot_key, sid) == 0 then
    return {'err', 'no_capacity', worker,
      'session ' .. sid .. ': generation ' .. tostring(e) .. ' holds no slot (released or deregistered)'}
  end
  return nil
end
