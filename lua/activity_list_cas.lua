-- activity_list_cas.lua - used by lib/preheat.c (lib/scripts.h: script_activity_list_cas).
-- Writes ACTIVITY:LIST only when its generation is still the one read before
-- the MySQL read behind the new value, and bumps the generation: KEYS[1] the
-- list, KEYS[2] its generation, ARGV[1] the value, ARGV[2] the generation
-- seen. Returns the new generation, or -1 when another writer came between.
local g = tonumber(redis.call('GET', KEYS[2]) or '0')
if g ~= tonumber(ARGV[2]) then return -1 end
redis.call('SET', KEYS[1], ARGV[1])
return redis.call('INCR', KEYS[2])
