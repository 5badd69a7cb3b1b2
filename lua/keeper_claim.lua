-- keeper_claim.lua - used by fcgi/keeper/keeper_claim.c (lib/scripts.h: script_keeper_claim).
-- Claiming the incarnation. KEYS: the claim. ARGV: this instance, the time
-- to live (ms), and a holder it may replace ("" none). 1 when the claim was
-- this instance's and still is; 2 when it is this instance's now but was not
-- (expired, or the holder replaced: another instance may have spent from the
-- incarnation's epochs meanwhile); else the holder's value.
local v = redis.call('GET', KEYS[1])
if not v or v == ARGV[1] or (ARGV[3] ~= '' and v == ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if v == ARGV[1] then return 1 end
  return 2
end
return v
