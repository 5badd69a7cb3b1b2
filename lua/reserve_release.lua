-- reserve_release.lua - used by lib/node/reserve.c (lib/scripts.h: script_reserve_release).
-- Releasing what an admin's return kept out of stock, once the node replayed
-- everything of that epoch (or the operator declared its journal lost).
-- KEYS: stock, reserve, epochs. ARGV: activityId, incarnation, epoch.
-- Returns how many went back (0: none parked), or -3 without a stock field
-- (nothing written; asked again later). Never onto a revoke tombstone.
--#include part/to_stock.lua
local pf = ARGV[2] .. ':' .. ARGV[3] .. ':parked'
local n = tonumber(redis.call('HGET', KEYS[3], pf) or '0')
if n <= 0 then return 0 end
local stock = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '')
if not stock then return -3 end
redis.call('HDEL', KEYS[3], pf)
local held = redis.call('HINCRBY', KEYS[2], ARGV[1] .. ':held', -n)
if held <= 0 and tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') <= 0 then
  redis.call('HDEL', KEYS[2], ARGV[1] .. ':held')
end
if stock >= 0 then return to_stock(KEYS[2], n) end
return n
