-- lock_release.lua - used by sync/drain.c (lib/scripts.h: script_lock_release).
-- Releases a shard's drain lock (KEYS[1]) when it still holds the owner's
-- token (ARGV[1]): 1 released, 0 someone else's (or gone).
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
else
  return 0
end
