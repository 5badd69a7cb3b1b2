-- reconcile.lua - used by lib/reconcile.c (lib/scripts.h: script_reconcile).
-- KEYS: stock hash, seize list, reserves. ARGV: activity id, MySQL total.
-- The stock becomes total - users who seized - what node reserves hold,
-- never below 0. {-3} no stock field, {-4} the revoke tombstone, else
-- {before, after, sold}.
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return {-3, 0, 0} end
v = tonumber(v)
if v == nil or v < 0 then return {-4, 0, 0} end
local sold = redis.call('HLEN', KEYS[2])
local held = tonumber(redis.call('HGET', KEYS[3], ARGV[1] .. ':held') or '0')
local want = tonumber(ARGV[2]) - sold - held
if want < 0 then want = 0 end
if want ~= v then redis.call('HSET', KEYS[1], ARGV[1], want) end
return {v, want, sold}
