-- seize.lua - one atomic seize step (see DESIGN.md "lua/seize.lua").
-- KEYS[1] COUPON:RESOURCE:STOCK:{i}   hash activityId -> remaining stock
-- KEYS[2] COUPON:SEIZE:LIST:<id>_{i}  hash userId -> seize time (ms)
-- KEYS[3] QUEUE:COUPON:SEIZE:SYNC:{i} hash "<activityId>:<userId>" -> seize time (ms)
-- ARGV    activityId, userId, nowMs
-- Returns -1 already seized, -3 no stock field (unknown / not preheated / revoked),
-- -2 sold out, else the remaining stock after this seize (>= 0).
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then
  return -1
end
local stock = redis.call('HGET', KEYS[1], ARGV[1])
if not stock then
  return -3
end
stock = tonumber(stock)
if stock == nil or stock <= 0 then
  return -2
end
redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[1] .. ':' .. ARGV[2], ARGV[3])
return stock - 1
