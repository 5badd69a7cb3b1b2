-- reserve_renew.lua - used by lib/node/reserve.c (lib/scripts.h: script_reserve_renew).
-- The lease of one shard. KEYS: reserve, stock, window. ARGV: incarnation,
-- the node's fallback.lease_ms, then activity ids. Records when this
-- incarnation last renewed ("lease:<incarnation>" -> Redis ms) and the lease
-- it spends by ("lease:<incarnation>:ms"), both for the admin's return of a
-- lost node's reserve, which waits by the node's own lease, and answers {seconds, microseconds, restore generation,
-- then per activity: its open reserve of this incarnation (false: none),
-- its stock (false: none), its window (false: none), the sum held}.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'lease:' .. ARGV[1], now, 'lease:' .. ARGV[1] .. ':ms', ARGV[2])
local out = {t[1], t[2], redis.call('HGET', KEYS[1], 'restored') or '0'}
for i = 3, #ARGV do
  local a = ARGV[i]
  out[#out + 1] = redis.call('HGET', KEYS[1], a .. ':' .. ARGV[1]) or ''
  out[#out + 1] = redis.call('HGET', KEYS[2], a) or ''
  out[#out + 1] = redis.call('HGET', KEYS[3], a) or ''
  out[#out + 1] = redis.call('HGET', KEYS[1], a .. ':held') or '0'
end
return out
