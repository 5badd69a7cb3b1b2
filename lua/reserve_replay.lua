-- reserve_replay.lua - used by lib/node/reserve.c (lib/scripts.h: script_reserve_replay).
-- Replaying one token. KEYS: stock, seize list, queue, reserve, epochs,
-- dead letters. ARGV: activityId, userId, incarnation, epoch, token, seize
-- time (ms, Redis' clock as estimated by the node). Checked and written in
-- this one script, so replaying twice changes nothing (0). The token's
-- marker names its user (the user id, "dup:<user>" or "dead:<user>"): a
-- marker of another user means the token was spent twice, an anomaly that
-- goes to the dead letters (-4; -6 when it is there already: a record read
-- again, nothing changed), never counted as the same grant replayed
-- (markers written before they named a user, a bare "dup" or "dead", are
-- taken as this user's). Both users were told SEIZED (two instances of one
-- incarnation): this one's grant takes from stock when there is any and
-- the user holds none, and its dead letter says so (5). Its own marker,
-- "<inc>:<epoch>:<token>:<user>" = the user (5) or "dead" (-4), answers a
-- record read again: 0 or -6, whatever became of the dead letter. From an open
-- epoch the reserve drops by one, and the grant enters the seize list and
-- the queue (1), or, when the user already holds a coupon, the token's goes
-- back to stock (2; never onto a revoke tombstone). A token of an epoch an
-- admin closed while its node may have been spending takes one of the
-- tokens the return kept out of stock ("<inc>:<epoch>:parked" in the epochs
-- hash, still counted in ':held'): granted (4) or, for a user who holds one,
-- back to stock (2). A token of an unknown or closed epoch takes from stock
-- (3) when there is any, else goes to the dead letters (-1). Without a
-- stock field (Redis lost its data and is not restored yet) nothing is
-- written (-3): the token waits.
--#include part/to_stock.lua
local mk = ARGV[3] .. ':' .. ARGV[4] .. ':' .. ARGV[5]
local was = redis.call('HGET', KEYS[5], mk)
if was then
  if was == ARGV[2] or was == 'dup' or was == 'dead' or was == 'dup:' .. ARGV[2] or was == 'dead:' .. ARGV[2] then return 0 end
  local twin = mk .. ':' .. ARGV[2]
  local seen = redis.call('HGET', KEYS[5], twin)
  if seen == ARGV[2] then return 0 end
  local dk = ARGV[1] .. ':' .. mk .. ':' .. ARGV[2]
  if seen or redis.call('HEXISTS', KEYS[6], dk) == 1 then return -6 end
  local note, code, mark = ARGV[2] .. ':' .. ARGV[6] .. ':token spent twice (marker of ' .. was .. ')', -4, 'dead'
  local left = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '')
  if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then
    note = note .. '; the user holds a coupon'
  elseif left and left > 0 then
    redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
    redis.call('HSET', KEYS[2], ARGV[2], ARGV[6])
    redis.call('HSET', KEYS[3], ARGV[1] .. ':' .. ARGV[2], ARGV[6])
    note, code, mark = note .. '; granted from stock', 5, ARGV[2]
  end
  redis.call('HSET', KEYS[5], twin, mark)
  redis.call('HSET', KEYS[6], dk, note)
  return code
end
local st = redis.call('HGET', KEYS[5], ARGV[3] .. ':' .. ARGV[4])
local rf = ARGV[1] .. ':' .. ARGV[3]
local open = st and string.sub(st, 1, 5) == 'open:' and redis.call('HEXISTS', KEYS[4], rf) == 1
local stock = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '')
if not stock then return -3 end
local has = redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1
local function grant(code)
  redis.call('HSET', KEYS[2], ARGV[2], ARGV[6])
  redis.call('HSET', KEYS[3], ARGV[1] .. ':' .. ARGV[2], ARGV[6])
  redis.call('HSET', KEYS[5], mk, ARGV[2])
  return code
end
if open then
  redis.call('HINCRBY', KEYS[4], rf, -1)
  redis.call('HINCRBY', KEYS[4], ARGV[1] .. ':held', -1)
  if has then
    if stock and stock >= 0 then to_stock(KEYS[4], 1) end
    redis.call('HSET', KEYS[5], mk, 'dup:' .. ARGV[2])
    return 2
  end
  return grant(1)
end
local pf = ARGV[3] .. ':' .. ARGV[4] .. ':parked'
local parked = tonumber(redis.call('HGET', KEYS[5], pf) or '0')
if parked > 0 then
  if parked == 1 then redis.call('HDEL', KEYS[5], pf)
  else redis.call('HINCRBY', KEYS[5], pf, -1) end
  redis.call('HINCRBY', KEYS[4], ARGV[1] .. ':held', -1)
  if has then
    if stock >= 0 then to_stock(KEYS[4], 1) end
    redis.call('HSET', KEYS[5], mk, 'dup:' .. ARGV[2])
    return 2
  end
  return grant(4)
end
if has then
  redis.call('HSET', KEYS[5], mk, 'dup:' .. ARGV[2])
  return 2
end
if stock and stock > 0 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
  return grant(3)
end
redis.call('HSET', KEYS[6], ARGV[1] .. ':' .. mk, ARGV[2] .. ':' .. ARGV[6])
redis.call('HSET', KEYS[5], mk, 'dead:' .. ARGV[2])
return -1
