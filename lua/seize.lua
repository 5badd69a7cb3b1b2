-- seize.lua - one atomic seize step (doc/internals.md, "The seize script").
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
-- (>= 0). The judgement is lua/part/judge.lua's, the same text as in
-- lua/seize_batch.lua; a key of the wrong type or a stock that is not an
-- integer is an error before the first write.
--
-- TIME is non-deterministic, so the script replicates its effects (the
-- default since Redis 5; the call keeps Redis 3.2-4 correct too).
if redis.replicate_commands then
  redis.replicate_commands()
end
--#include part/judge.lua
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then
  return -1
end
local now, nows = redis_now()
local code, stock = judge(KEYS[1], ARGV[1], redis.call('HGET', KEYS[1], ARGV[1]),
                          redis.call('HGET', KEYS[4], ARGV[1]), now)
if code then
  return code
end
-- The queue first: the one key not read above, so the one write that can fail.
redis.call('HSET', KEYS[3], ARGV[1] .. ':' .. ARGV[2], nows)
redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
redis.call('HSET', KEYS[2], ARGV[2], nows)
return stock - 1
