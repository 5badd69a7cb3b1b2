-- judge.lua - the seize's judgement, one text for lua/seize.lua and
-- lua/seize_batch.lua, joined to each where it says
-- "--#include part/judge.lua" (Makefile.am). Every function only reads.
-- A script that uses them leaves nothing half applied: judge() refuses a
-- stock HINCRBY could not take, the seize list's type is proven by its read,
-- and the one key written unread, the sync queue, is written first, so
-- only the first write can fail.

-- Redis' clock in milliseconds, and the same instant as a string (a Lua
-- number given to redis.call is formatted with "%.17g" each time).
local function redis_now()
  local t = redis.call('TIME')
  local ms = math.floor(tonumber(t[2]) / 1000)
  return tonumber(t[1]) * 1000 + ms, t[1] .. string.format('%03d', ms)
end

-- The answer of a seize of activity aid that finds no stock left (n <= 0):
-- -6 when node reserves hold some, open or parked by an admin's return
-- ('<id>:held'): either may come back, so sold out is not final; else -2.
-- The reserves' count lives in COUPON:RESERVE:{i}, the stock key's own slot.
local function sold_out(stockkey, aid, n)
  if n == 0 then
    local tag = string.match(stockkey, '{[^}]*}$')
    if tag then
      local rk = 'COUPON:RESERVE:' .. tag
      if tonumber(redis.call('HGET', rk, aid) or '0') > 0
          or tonumber(redis.call('HGET', rk, aid .. ':held') or '0') > 0 then
        return -6
      end
    end
  end
  return -2
end

-- What a seize of activity aid finds at Redis time now, from its stock and
-- window fields: nil and the stock when it may take a coupon, else its
-- answer: -3 no stock or window field (not preheated), -4 not started,
-- -5 ended (by Redis' own clock, never the caller's), -2 or -6 sold out. A
-- stock field that is not an integer HINCRBY takes is an error, raised
-- before any write.
local function judge(stockkey, aid, stock, window, now)
  if not stock or not window then
    return -3
  end
  local startms, endms = string.match(window, '^(%d+),(%d+)$')
  if not startms then
    return -3
  end
  if now < tonumber(startms) then
    return -4
  end
  if now >= tonumber(endms) then
    return -5
  end
  if #stock > 19 or not string.match(stock, '^%-?%d+$') then
    error('seize: the stock of activity ' .. aid .. ' is not an integer')
  end
  local n = tonumber(stock)
  if n <= 0 then
    return sold_out(stockkey, aid, n)
  end
  return nil, n
end
