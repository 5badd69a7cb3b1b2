-- lock_renew.lua - used by sync/drain.c (lib/scripts.h: script_lock_renew).
-- A shard's drain lock: KEYS[1] the lock, ARGV[1] the owner's token, ARGV[2]
-- the time to live (ms). The owner holds the lock only while the stored token
-- is its own: 1 renewed, 0 not (any more) the owner's.
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
else
  return 0
end
