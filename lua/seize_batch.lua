-- seize_batch.lua - the seizes of one shard in one atomic step, each judged
-- as lua/seize.lua judges one, in the order given (DESIGN.md "Group commit of
-- seizes"): first come, first served holds inside a batch.
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
-- Every read comes before any write: an error cannot leave a batch half
-- applied. The writes are one command per key, whatever the batch's size.
if redis.replicate_commands then
  redis.replicate_commands()
end
-- A batch is whole triples, or it is refused before anything is read.
if #ARGV == 0 or #ARGV % 3 ~= 0 then
  return redis.error_reply('ERR seize_batch.lua: ARGV is not whole triples')
end
local t = redis.call('TIME')
local ms = math.floor(tonumber(t[2]) / 1000)
local now = tonumber(t[1]) * 1000 + ms
-- The same instant as a string, made once: a Lua number given to redis.call
-- is formatted with "%.17g" for every argument it appears in.
local nows = t[1] .. string.format('%03d', ms)
local tag = string.match(KEYS[1], '{[^}]*}$')
local acts, order, out = {}, {}, { now }

-- The activity's state as the batch began: its stock or why none is sold,
-- and which of the batch's users already hold one (one HMGET for them all).
-- Read once per activity: the loop below keeps it in acts.
local function activity(aid, list)
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
  local stock = redis.call('HGET', KEYS[1], aid)
  local window = redis.call('HGET', KEYS[3], aid)
  local startms, endms
  if window then
    startms, endms = string.match(window, '^(%d+),(%d+)$')
  end
  if not stock or not startms then
    a.err = -3
  elseif now < tonumber(startms) then
    a.err = -4
  elseif now >= tonumber(endms) then
    a.err = -5
  else
    a.stock = tonumber(stock)
    if a.stock == nil then
      a.err = -2
    end
  end
  return a
end

-- The answer of a seize that finds no stock left: as seize.lua's, read once
-- (the reserves' count does not change inside the script).
local function sold_out(aid, a)
  if a.out == nil then
    a.out = -2
    -- Open or parked (an admin's return, '<id>:held'): either may come back.
    if a.stock == 0 and tag
        and (tonumber(redis.call('HGET', 'COUPON:RESERVE:' .. tag, aid) or '0') > 0
          or tonumber(redis.call('HGET', 'COUPON:RESERVE:' .. tag, aid .. ':held') or '0') > 0) then
      a.out = -6
    end
  end
  return a.out
end

for j = 1, #ARGV, 3 do
  local aid, uid = ARGV[j], ARGV[j + 1]
  local a = acts[aid] or activity(aid, KEYS[tonumber(ARGV[j + 2])])
  local code, seized = 0, 0
  local held = a.seen[uid] or a.held[uid]
  if held then
    code, seized = -1, tonumber(held)
  elseif a.err then
    code = a.err
  elseif a.stock <= 0 then
    code = sold_out(aid, a)
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

for _, aid in ipairs(order) do
  local a = acts[aid]
  if a.n > 0 then
    redis.call('HINCRBY', KEYS[1], aid, -a.n)
    redis.call('HSET', a.list, unpack(a.granted))
    redis.call('HSET', KEYS[2], unpack(a.queued))
  end
end
return out
