-- seize_batch.lua - the seizes of one shard in one atomic step, each judged
-- as lua/seize.lua judges one, in the order given (doc/internals.md, "Group
-- commit of seizes"): first come, first served holds inside a batch.
-- KEYS[1] COUPON:RESOURCE:STOCK:{i}   hash activityId -> remaining stock
-- KEYS[2] QUEUE:COUPON:SEIZE:SYNC:{i} hash "<activityId>:<userId>" -> seize time (ms)
-- KEYS[3] COUPON:ACTIVITY:WINDOW:{i}  hash activityId -> "<startMs>,<endMs>"
-- KEYS[4..] COUPON:SEIZE:LIST:<id>_{i}, one per activity of the batch
-- ARGV    triples: activityId, userId, the index in KEYS of its seize list
-- Returns { now_ms, code_1, seized_1, ..., code_n, seized_n }: code_j is what
-- seize.lua would answer the j-th seize had the ones before it run first
-- (-1 already seized, -2 sold out, -3 unknown, -4 not started, -5 ended,
-- -6 sold out for now, else the stock left after it); seized_j is, for -1,
-- the time of the grant the user holds (Redis' clock), so that a resent
-- batch can tell its own grant from an older one; else 0.
--
-- Every read and every check comes before any write (lua/part/judge.lua:
-- each stock an integer, each seize list read and the one of its activity),
-- and the sync queue, the one key written unread, is written first, so an
-- error leaves nothing applied. The writes are one command per key,
-- whatever the batch's size.
if redis.replicate_commands then
  redis.replicate_commands()
end
--#include part/judge.lua
-- A batch is whole triples, or it is refused before anything is read.
if #ARGV == 0 or #ARGV % 3 ~= 0 then
  return redis.error_reply('ERR seize_batch.lua: ARGV is not whole triples')
end
local now, nows = redis_now()
local tag = string.match(KEYS[1], '{[^}]*}$') or ''
local acts, order, out = {}, {}, { now }

-- The activity's state as the batch began: its stock or why none is sold,
-- and which of the batch's users already hold one (one HMGET for them all).
-- Read once per activity: the loop below keeps it in acts. Its seize list
-- must be the key of its own activity and slot, or a grant would be
-- recorded under another sale.
local function activity(aid, idx)
  local list = KEYS[tonumber(idx)]
  local suffix = ':' .. aid .. '_' .. tag
  if list == nil or tonumber(idx) < 4 or string.sub(list, -#suffix) ~= suffix then
    error('seize_batch.lua: KEYS[' .. idx .. '] is not the seize list of activity ' .. aid)
  end
  local a = { list = list, seen = {}, granted = {}, queued = {}, n = 0, held = {} }
  acts[aid] = a
  order[#order + 1] = aid
  local users = {}
  for j = 1, #ARGV, 3 do
    if ARGV[j] == aid then
      users[#users + 1] = ARGV[j + 1]
    end
  end
  local held = redis.call('HMGET', list, unpack(users))
  for k = 1, #users do
    if held[k] then
      a.held[users[k]] = held[k]
    end
  end
  a.err, a.stock = judge(KEYS[1], aid, redis.call('HGET', KEYS[1], aid),
                         redis.call('HGET', KEYS[3], aid), now)
  return a
end

for j = 1, #ARGV, 3 do
  local aid, uid = ARGV[j], ARGV[j + 1]
  local a = acts[aid] or activity(aid, ARGV[j + 2])
  local code, seized = 0, 0
  local held = a.seen[uid] or a.held[uid]
  if held then
    code, seized = -1, tonumber(held)
  elseif a.err then
    code = a.err
  elseif a.stock <= 0 then
    -- Its last coupon went to a seize before this one in the batch.
    a.err = sold_out(KEYS[1], aid, 0)
    code = a.err
  else
    a.stock = a.stock - 1
    a.n = a.n + 1
    a.seen[uid] = now
    a.granted[#a.granted + 1] = uid
    a.granted[#a.granted + 1] = nows
    a.queued[#a.queued + 1] = aid .. ':' .. uid
    a.queued[#a.queued + 1] = nows
    code = a.stock
  end
  out[#out + 1] = code
  out[#out + 1] = seized
end

-- The queue first: the one key not read above, so only the batch's first
-- write can fail (lua/part/judge.lua).
for _, aid in ipairs(order) do
  local a = acts[aid]
  if a.n > 0 then
    redis.call('HSET', KEYS[2], unpack(a.queued))
    redis.call('HINCRBY', KEYS[1], aid, -a.n)
    redis.call('HSET', a.list, unpack(a.granted))
  end
end
return out
