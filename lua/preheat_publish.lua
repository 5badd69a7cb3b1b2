-- preheat_publish.lua - used by lib/preheat.c (lib/scripts.h: script_preheat_publish).
-- Writes what preheat derives from MySQL for the activities in ARGV, seven
-- arguments each (id, version, META, WINDOW, end ms, stock or "", total),
-- unless the VER field holds a newer version: a preheat that read MySQL
-- before a change committed never puts back what the change already wrote,
-- however the two interleave. META and WINDOW go before the stock field.
--
-- The stock field follows the total under the same check. Absent, it is
-- created from the stock argument (HSETNX semantics; "" creates nothing).
-- Present, it moves by the new total minus the total that the META in Redis
-- was written with, so a change of total_num (a lower total before the
-- start, a top-up) reaches the stock exactly once, whichever writer of that
-- version (the admin update, a racing preheat, the next periodic pass) gets
-- there first, and a writer of an older version changes nothing. The revoke
-- tombstone (below 0) is never added to, and no stock goes below 0 (counted
-- as clamped: the total fell below what Redis had already granted).
-- ENDS (a sorted set by end time) tells the expiry job what is due without
-- reading every META.
-- KEYS: META, WINDOW, VER, ENDS, STOCK of one shard. Returns {created,
-- adjusted, clamped, id, META, ...}: the stock fields created, those moved
-- by a change of total, those held at 0, then each refused id with the META
-- field that stays.
local created, adjusted, clamped, out = 0, 0, 0, {0, 0, 0}
for i = 1, #ARGV, 7 do
  local id = ARGV[i]
  local cur = tonumber(redis.call('HGET', KEYS[3], id) or '')
  if cur and cur > tonumber(ARGV[i + 1]) then
    out[#out + 1] = id
    out[#out + 1] = redis.call('HGET', KEYS[1], id) or ''
  else
    local old = redis.call('HGET', KEYS[1], id)
    redis.call('HSET', KEYS[1], id, ARGV[i + 2])
    redis.call('HSET', KEYS[2], id, ARGV[i + 3])
    redis.call('HSET', KEYS[3], id, ARGV[i + 1])
    redis.call('ZADD', KEYS[4], ARGV[i + 4], id)
    local s = tonumber(redis.call('HGET', KEYS[5], id) or '')
    if s then
      local was = old and tonumber(string.match(old, '"totalNum":(%-?[%d.eE+]+)'))
      local d = was and (tonumber(ARGV[i + 6]) - was) or 0
      if d ~= 0 and s >= 0 then
        if s + d < 0 then
          d = -s
          clamped = clamped + 1
        end
        redis.call('HINCRBY', KEYS[5], id, d)
        adjusted = adjusted + 1
      end
    elseif ARGV[i + 5] ~= '' then
      created = created + redis.call('HSETNX', KEYS[5], id, ARGV[i + 5])
    end
  end
end
out[1], out[2], out[3] = created, adjusted, clamped
return out
