-- to_stock.lua - a part of reserve_give_back.lua, reserve_release.lua and
-- reserve_replay.lua, joined to each where it says "--#include part/to_stock.lua"
-- (Makefile.am). KEYS[1] is the stock hash and ARGV[1] the activity id in
-- each of them.
-- What goes back to stock first pays what a restore counted twice
-- ('<id>:debt' in the reserve hash rk, lua/restore.lua); the rest is added.
-- Returns what was added.
local function to_stock(rk, n)
  local df = ARGV[1] .. ':debt'
  local d = tonumber(redis.call('HGET', rk, df) or '0')
  if d > 0 then
    local p = math.min(d, n)
    if p == d then redis.call('HDEL', rk, df) else redis.call('HINCRBY', rk, df, -p) end
    n = n - p
  end
  if n > 0 then redis.call('HINCRBY', KEYS[1], ARGV[1], n) end
  return n
end
