-- coupon_return.lua - used by lib/coupon.c (lib/scripts.h: script_coupon_return).
-- KEYS[1] stock hash, KEYS[2] seize list; ARGV activityId, userId, seize ms.
-- The seize time makes it idempotent: after a first run the entry is gone,
-- and a user who seized again since carries a later time.
local s = redis.call('HGET', KEYS[1], ARGV[1])
if not s then return -3 end
s = tonumber(s)
if s == nil or s < 0 then return -4 end
if redis.call('HGET', KEYS[2], ARGV[2]) ~= ARGV[3] then return 0 end
redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
return 1
