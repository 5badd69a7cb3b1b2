-- reserve_give_back.lua - used by lib/node/reserve.c (lib/scripts.h: script_reserve_give_back).
-- Giving back. KEYS: stock, reserve, epochs. ARGV: activityId, incarnation,
-- epoch, the lease (ms) that must have passed since the node's last renewal
-- (0 for the node itself; an admin returning a lost node's reserve passes
-- its own fallback.lease_ms, and the node's published lease counts when it
-- is longer), 1 when given back at the low-water mark (no more set-aside
-- for this sale then), and, for an admin, 1 when the operator declared the
-- node's journal lost and the node's lease stamp it judged the lease by
-- (lib/node/lease_watch.h; -1: none): a renewal since then refuses the return.
-- Returns what went back to stock, -1 when the epoch is not open (given
-- back already), -2 when the node renewed within the lease or since the
-- stamp (the admin must wait), or -3 when the sale has no stock field
-- (Redis lost it and a restore is under way, or not done yet): nothing is
-- written then, since the reserve would go back to nothing and be lost
-- (rule 18); the caller asks again later.
--
-- An admin's return of a journal not declared lost closes the epoch and
-- keeps what its node may have granted out of stock (rule 16): the field's
-- tokens become "<inc>:<epoch>:parked" in the epochs hash, still counted in
-- ':held', and the answer is {0, parked}. The node's replay takes its
-- grants from them, and RESERVE_LUA_RELEASE puts the rest back afterwards.
-- ':held' goes once nothing is open or parked: Lua writes -0 as "-0", which
-- HINCRBY refuses, so nothing is added when nothing is left.
if redis.replicate_commands then redis.replicate_commands() end
--#include part/to_stock.lua
local ef = ARGV[2] .. ':' .. ARGV[3]
local st = redis.call('HGET', KEYS[3], ef)
if not st or string.sub(st, 1, 5) ~= 'open:' then return -1 end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return -3 end
local admin = tonumber(ARGV[4]) > 0
if admin then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local stamp = redis.call('HGET', KEYS[2], 'lease:' .. ARGV[2])
  if ARGV[7] and tonumber(stamp or '-1') ~= tonumber(ARGV[7]) then return -2 end
  local last = tonumber(stamp or '0')
  local lease = math.max(tonumber(ARGV[4]), tonumber(redis.call('HGET', KEYS[2], 'lease:' .. ARGV[2] .. ':ms') or '0'))
  if now - last <= lease then return -2 end
end
local rf = ARGV[1] .. ':' .. ARGV[2]
local left = tonumber(redis.call('HGET', KEYS[2], rf) or '0')
redis.call('HDEL', KEYS[2], rf)
redis.call('HSET', KEYS[3], ef, 'closed')
if ARGV[5] == '1' then redis.call('HSET', KEYS[2], ARGV[1] .. ':low', 1) end
local park = admin and ARGV[6] ~= '1' and left > 0
if park then
  redis.call('HSET', KEYS[3], ef .. ':parked', left)
elseif left > 0 then
  redis.call('HINCRBY', KEYS[2], ARGV[1] .. ':held', -left)
end
if redis.call('HINCRBY', KEYS[2], ARGV[1], -1) <= 0 then
  redis.call('HDEL', KEYS[2], ARGV[1])
  if tonumber(redis.call('HGET', KEYS[2], ARGV[1] .. ':held') or '0') <= 0 then
    redis.call('HDEL', KEYS[2], ARGV[1] .. ':held')
  end
end
if park then return {0, left} end
local stock = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '')
if stock and stock >= 0 and left > 0 then
  return to_stock(KEYS[2], left)
end
return 0
