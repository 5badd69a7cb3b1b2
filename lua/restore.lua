-- restore.lua - used by lib/restore.c (lib/scripts.h: script_restore).
-- The stock field and the reserve fields of one activity, written in one
-- step (internals.md rule 18): a keeper renewing in between must never see a
-- reserve without its sale's stock, nor the stock without the reserves it
-- leaves out. KEYS: stock, reserve, epochs. ARGV: activityId, stock, the
-- restore generation, 1 to recreate the reserves (0: the stock only), the
-- number of open epochs, the debt (below), then per open epoch its incarnation, epoch and
-- amount, then per returned epoch awaiting its node its incarnation, epoch
-- and parked count. Nothing is written when
-- the stock field exists (a live sale, or a restore that raced this one:
-- that one wrote both): 0; else 1.
--
-- The reserve fields are recreated as set-aside wrote them (each epoch's
-- full amount, so that what its node gives back or replays balances what
-- the stock leaves out), and the shard's restore generation is set to a
-- value of this restore's own, so nodes stop spending until they have
-- replayed. Each reserve field is set only where absent.
--
-- ARGV[5] is how many open epochs follow; after them come the epochs an
-- admin returned whose node has not replayed yet (incarnation, epoch,
-- parked): what the return kept out of stock is kept out again, as the
-- return wrote it ('<inc>:<epoch>:parked', counted in '<id>:held'), for the
-- node's replay to take from and its release to give back.
--
-- Tokens a node replayed before the loss are counted twice here, as coupons
-- in MySQL and in their epoch's amount; what the node gives back or replays
-- again later evens that out. When the count passes the total, the stock is
-- 0 and the excess is '<id>:debt': what goes back to stock pays it first
-- (reserve_give_back, reserve_release, reserve_replay), so that it is never
-- sold twice.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
if ARGV[4] == '1' then
  local nopen = tonumber(ARGV[5])
  if tonumber(ARGV[6]) > 0 then redis.call('HSET', KEYS[2], ARGV[1] .. ':debt', ARGV[6]) end
  local n, sum = 0, 0
  for i = 7, #ARGV - 2, 3 do
    if n < nopen then
      redis.call('HSETNX', KEYS[2], ARGV[1] .. ':' .. ARGV[i], ARGV[i + 2])
      redis.call('HSETNX', KEYS[3], ARGV[i] .. ':' .. ARGV[i + 1], 'open:' .. ARGV[i + 2])
      n = n + 1
    else
      redis.call('HSETNX', KEYS[3], ARGV[i] .. ':' .. ARGV[i + 1], 'closed')
      redis.call('HSETNX', KEYS[3], ARGV[i] .. ':' .. ARGV[i + 1] .. ':parked', ARGV[i + 2])
    end
    sum = sum + tonumber(ARGV[i + 2])
  end
  if n > 0 then
    redis.call('HSETNX', KEYS[2], ARGV[1], n)
  end
  if sum > 0 then
    redis.call('HSETNX', KEYS[2], ARGV[1] .. ':held', sum)
  end
  redis.call('HSET', KEYS[2], 'restored', ARGV[3])
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
