-- seize.lua - one atomic seize step (see DESIGN.md "lua/seize.lua").
-- KEYS[1] COUPON:RESOURCE:STOCK:{i}   hash activityId -> remaining stock
-- KEYS[2] COUPON:SEIZE:LIST:<id>_{i}  hash userId -> seize time (ms)
-- KEYS[3] QUEUE:COUPON:SEIZE:SYNC:{i} hash "<activityId>:<userId>" -> seize time (ms)
-- KEYS[4] COUPON:ACTIVITY:WINDOW:{i}  hash activityId -> "<startMs>,<endMs>"
-- ARGV    activityId, userId
-- Returns -1 already seized, -3 no stock or window field (unknown / not
-- preheated), -4 not started, -5 ended, -2 sold out (or revoked: the stock
-- field is a tombstone below zero), -6 no stock now but nodes still hold
-- reserves of it, open or parked by an admin's return (sold out for now, not
-- for good: they may come back), else the remaining stock after this seize
-- (>= 0).
--
-- The reserves' count lives in COUPON:RESERVE:{i}, the stock key's own
-- hash slot; it is read only when the stock is gone, so the common path
-- touches exactly the four keys above.
--
-- The window is judged by Redis' own clock, never by the caller's: a node
-- whose clock is wrong can neither open a sale early nor keep it open late.
-- TIME is non-deterministic, so the script replicates its effects (the
-- default since Redis 5; the call keeps Redis 3.2-4 correct too).
if redis.replicate_commands then
  redis.replicate_commands()
end
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then
  return -1
end
local stock = redis.call('HGET', KEYS[1], ARGV[1])
local window = redis.call('HGET', KEYS[4], ARGV[1])
if not stock or not window then
  return -3
end
local startms, endms = string.match(window, '^(%d+),(%d+)$')
if not startms then
  return -3
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now < tonumber(startms) then
  return -4
end
if now >= tonumber(endms) then
  return -5
end
stock = tonumber(stock)
if stock == nil or stock <= 0 then
  if stock == 0 then
    -- Open reserves, or tokens an admin's return parked out of stock until
    -- their node replays (counted in '<id>:held' after the epoch closed):
    -- either may still come back to stock, so sold out is not final yet.
    local tag = string.match(KEYS[1], '{[^}]*}$')
    if tag then
      local rk = 'COUPON:RESERVE:' .. tag
      if tonumber(redis.call('HGET', rk, ARGV[1]) or '0') > 0
          or tonumber(redis.call('HGET', rk, ARGV[1] .. ':held') or '0') > 0 then
        return -6
      end
    end
  end
  return -2
end
redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
redis.call('HSET', KEYS[2], ARGV[2], now)
redis.call('HSET', KEYS[3], ARGV[1] .. ':' .. ARGV[2], now)
return stock - 1
