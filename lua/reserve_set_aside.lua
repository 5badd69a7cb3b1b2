-- reserve_set_aside.lua - used by lib/node/reserve.c (lib/scripts.h: script_reserve_set_aside).
-- Setting aside. KEYS: stock, window, reserve, epochs. ARGV: activityId,
-- incarnation, epoch, wanted. Idempotent per (incarnation, epoch): asked
-- again it answers what it did the first time (the amount, or -1 for an
-- epoch that is closed or was refused). Judged by Redis' clock: only while
-- the sale is open, at most a tenth of what is left, and only while the
-- stock stays at or above twice everything set aside (the low-water mark).
-- A refusal is recorded as a closed epoch, so a retry refuses too.
if redis.replicate_commands then redis.replicate_commands() end
local ef = ARGV[2] .. ':' .. ARGV[3]
local st = redis.call('HGET', KEYS[4], ef)
if st then
  local n = string.match(st, '^open:(%d+)$')
  if n then return tonumber(n) end
  return -1
end
local function refuse() redis.call('HSET', KEYS[4], ef, 'closed') return -1 end
local rf = ARGV[1] .. ':' .. ARGV[2]
if redis.call('HEXISTS', KEYS[3], rf) == 1 or redis.call('HEXISTS', KEYS[3], ARGV[1] .. ':low') == 1 then return refuse() end
local stock = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '')
local window = redis.call('HGET', KEYS[2], ARGV[1])
if not stock or not window then return refuse() end
local s, e = string.match(window, '^(%d+),(%d+)$')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not s or now < tonumber(s) or now >= tonumber(e) then return refuse() end
local held = tonumber(redis.call('HGET', KEYS[3], ARGV[1] .. ':held') or '0')
local n = math.min(tonumber(ARGV[4]), math.floor(stock / 10))
if n <= 0 or stock - n < 2 * (held + n) then return refuse() end
redis.call('HINCRBY', KEYS[1], ARGV[1], -n)
redis.call('HSET', KEYS[3], rf, n)
redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
redis.call('HINCRBY', KEYS[3], ARGV[1] .. ':held', n)
redis.call('HSET', KEYS[4], ef, 'open:' .. n)
return n
