-- nginx_seize.lua - the nginx + ngx_lua peer of coupon-fcgi's seize route, for
-- benchmarks: what a user of this trade would write instead of a FastCGI
-- service, the seize inside the nginx worker (no FastCGI hop).
--
-- Per request, as coupon-fcgi does on its seize route (fcgi/req/auth.c,
-- fcgi/api/api_seize.c): POST only; an HS256 JWT from "Authorization: Bearer"
-- (alg exactly "HS256", no "crit", "typ" absent or JWT, a 32-byte signature
-- checked with HMAC-SHA-256 through FFI to OpenSSL, keyed once per worker;
-- "exp" required and in the future, "nbf" honoured; "sub" a decimal user id,
-- string or positive integer); a JSON body {"id": N} with Content-Type
-- application/json; then one EVALSHA of lua/seize.lua on the same four keys
-- (lib/keys.c) over a cosocket taken from a keep-alive pool, EVAL once on
-- NOSCRIPT; the answer in the same JSON shape and HTTP status.
--
-- What it leaves out, each making it cheaper than coupon-fcgi: the
-- activity metadata (cached window, groups), the node's rate limit and
-- sold-out hint, metrics, the breaker and reserves, and the rule that refuses
-- a duplicate member name in a token or body (cjson keeps the last one).
-- cjson reads numbers as doubles: ids above 2^53 are refused, and a "sub" of
-- 42.0 passes as 42 (coupon-fcgi wants a JSON integer).
--
-- Environment, read once at start (nginx.conf keeps it with "env"):
-- COUPON_JWT_SECRET, REDIS_HOST, REDIS_PORT, COUPON_SCRIPT (the script as
-- coupon-fcgi sends it: tests/lib.sh lua_text seize).
local ffi = require "ffi"
local cjson = require "cjson.safe"
local b64 = require "ngx.base64"

local ngx = ngx
local tcp = ngx.socket.tcp
local byte, sub, find, format, concat = string.byte, string.sub, string.find,
    string.format, table.concat
local decode_b64url = b64.decode_base64url

local _M = {}

ffi.cdef [[
typedef struct evp_md_st EVP_MD;
typedef struct hmac_ctx_st HMAC_CTX;
const EVP_MD *EVP_sha256(void);
HMAC_CTX *HMAC_CTX_new(void);
int HMAC_Init_ex(HMAC_CTX *ctx, const char *key, int len, const EVP_MD *md, void *impl);
int HMAC_Update(HMAC_CTX *ctx, const char *data, size_t len);
int HMAC_Final(HMAC_CTX *ctx, unsigned char *md, unsigned int *len);
int CRYPTO_memcmp(const unsigned char *a, const char *b, size_t len);
]]

-- nginx links libcrypto: its symbols are in the process already.
local C = ffi.C
local ok_sym = pcall(function() return C.HMAC_CTX_new end)
if not ok_sym then
    C = ffi.load("libcrypto.so.3")
end

local secret, script, sha, redis_host, redis_port
local hmac_ctx -- per worker: forked after init, keyed lazily
local mac_buf = ffi.new("unsigned char[64]")
local mac_len = ffi.new("unsigned int[1]")

local POOL = 256          -- kept Redis connections per worker
local IDLE_MS = 60000
local TIMEOUT_MS = 1000   -- coupon-fcgi's fallback.budget_ms default

local function hex(s)
    return (s:gsub(".", function(c) return format("%02x", byte(c)) end))
end

-- Called from init_by_lua: reads the environment and the script.
function _M.init()
    secret = assert(os.getenv("COUPON_JWT_SECRET"), "COUPON_JWT_SECRET unset")
    redis_host = os.getenv("REDIS_HOST") or "127.0.0.1"
    redis_port = tonumber(os.getenv("REDIS_PORT") or "6379")
    local path = assert(os.getenv("COUPON_SCRIPT"), "COUPON_SCRIPT unset")
    local f = assert(io.open(path, "rb"))
    script = f:read("*a")
    f:close()
    sha = hex(ngx.sha1_bin(script))
end

local STATUS = {
    SEIZED = 200, ALREADY_SEIZED = 409, SOLD_OUT = 409, NOT_STARTED = 409, ENDED = 409,
    NO_SUCH_ACTIVITY = 404, BAD_REQUEST = 400, UNAUTHORIZED = 401,
    METHOD_NOT_ALLOWED = 405, TOO_LARGE = 413, UNSUPPORTED_MEDIA_TYPE = 415,
    UNAVAILABLE = 503, UNKNOWN_OUTCOME = 503,
}
local MSG = {
    SEIZED = "you got a coupon",
    ALREADY_SEIZED = "one coupon per user per activity",
    SOLD_OUT = "all coupons of this activity are gone",
    NOT_STARTED = "the activity has not started yet",
    ENDED = "the activity has ended",
    NO_SUCH_ACTIVITY = "no such activity",
    BAD_REQUEST = "malformed request",
    UNAUTHORIZED = "missing or invalid token",
    METHOD_NOT_ALLOWED = "method not allowed on this route",
    TOO_LARGE = "request body too large",
    UNSUPPORTED_MEDIA_TYPE = "Content-Type must be application/json",
    UNAVAILABLE = "service temporarily unavailable, retry later",
    UNKNOWN_OUTCOME = "the outcome is unknown; ask status?id or seize again",
}
-- The script's answers (lib/scripts.h).
local OUTCOME = {
    [-1] = "ALREADY_SEIZED", [-2] = "SOLD_OUT", [-3] = "NO_SUCH_ACTIVITY",
    [-4] = "NOT_STARTED", [-5] = "ENDED", [-6] = "SOLD_OUT",
}

local function reply(code, extra, retry)
    local body = extra and concat({'{"code":"', code, '","msg":"', MSG[code], '",', extra, "}"})
        or concat({'{"code":"', code, '","msg":"', MSG[code], '"}'})
    local h = ngx.header
    h["Content-Type"] = "application/json; charset=utf-8"
    h["Cache-Control"] = "no-store"
    h["Content-Length"] = #body
    if retry then
        h["Retry-After"] = retry
    end
    ngx.status = STATUS[code]
    ngx.print(body)
end

-- A JSON object from one base64url segment, or nil.
local function segment(s)
    local raw = decode_b64url(s)
    if not raw or find(raw, "\0", 1, true) then
        return nil
    end
    local t = cjson.decode(raw)
    return type(t) == "table" and t or nil
end

local MAX_ID = 9007199254740992 -- 2^53: exact in a double

-- The user id of a valid token, or nil (fcgi/req/auth.c token_parse and check_claims).
local function token_user(authorization)
    if not authorization or #authorization < 8
        or sub(authorization, 1, 7):lower() ~= "bearer " then
        return nil
    end
    local t = authorization:match("^ *(.*)$", 8)
    if #t == 0 or #t > 4096 then
        return nil
    end
    local d1 = find(t, ".", 1, true)
    local d2 = d1 and find(t, ".", d1 + 1, true)
    if not d2 or find(t, ".", d2 + 1, true) or #t - d2 ~= 43 then
        return nil
    end
    local sig = decode_b64url(sub(t, d2 + 1))
    if not sig or #sig ~= 32 then
        return nil
    end
    local head = segment(sub(t, 1, d1 - 1))
    if not head or head.alg ~= "HS256" or head.crit ~= nil then
        return nil
    end
    -- libjwt's rule, as fcgi/req/auth.c keeps it: a string "typ" says JWT, in any case.
    local typ = head.typ
    if type(typ) == "string" and typ:upper() ~= "JWT" then
        return nil
    end
    local claims = segment(sub(t, d1 + 1, d2 - 1))
    if not claims then
        return nil
    end
    if not hmac_ctx then
        hmac_ctx = C.HMAC_CTX_new()
        if C.HMAC_Init_ex(hmac_ctx, secret, #secret, C.EVP_sha256(), nil) ~= 1 then
            hmac_ctx = nil
            return nil
        end
    elseif C.HMAC_Init_ex(hmac_ctx, nil, 0, nil, nil) ~= 1 then -- the same key again
        return nil
    end
    if C.HMAC_Update(hmac_ctx, t, d2 - 1) ~= 1 or C.HMAC_Final(hmac_ctx, mac_buf, mac_len) ~= 1
        or mac_len[0] ~= 32 or C.CRYPTO_memcmp(mac_buf, sig, 32) ~= 0 then
        return nil
    end
    local now = ngx.time()
    local exp, nbf = claims.exp, claims.nbf
    if type(exp) ~= "number" or exp ~= exp or exp <= now then
        return nil
    end
    if nbf ~= nil and (type(nbf) ~= "number" or nbf ~= nbf or nbf > now) then
        return nil
    end
    local s = claims.sub
    if type(s) == "string" then
        if not s:match("^[1-9]%d*$") or #s > 19 or (#s == 19 and s > "9223372036854775807") then
            return nil
        end
        return s
    elseif type(s) == "number" and s > 0 and s == math.floor(s) and s < MAX_ID then
        return format("%d", s)
    end
    return nil
end

-- One Redis command over a pooled cosocket. Returns the reply (an integer,
-- or a string for a status or bulk), or nil, err, sent (sent: the command
-- was written, so Redis may have run it).
local function redis_call(args)
    local sock = tcp()
    sock:settimeouts(TIMEOUT_MS, TIMEOUT_MS, TIMEOUT_MS)
    local ok, err = sock:connect(redis_host, redis_port)
    if not ok then
        return nil, err, false
    end
    local req = { "*", #args, "\r\n" }
    for i = 1, #args do
        local a = args[i]
        req[#req + 1] = "$"
        req[#req + 1] = #a
        req[#req + 1] = "\r\n"
        req[#req + 1] = a
        req[#req + 1] = "\r\n"
    end
    ok, err = sock:send(req)
    if not ok then
        sock:close()
        return nil, err, true
    end
    local line
    line, err = sock:receive()
    if not line then
        sock:close()
        return nil, err, true
    end
    local kind, rest = sub(line, 1, 1), sub(line, 2)
    local res
    if kind == ":" then
        res = tonumber(rest)
    elseif kind == "-" then
        sock:setkeepalive(IDLE_MS, POOL)
        return nil, rest, true
    elseif kind == "+" then
        res = rest
    elseif kind == "$" then
        local n = tonumber(rest)
        if n >= 0 then
            res, err = sock:receive(n + 2)
            if not res then
                sock:close()
                return nil, err, true
            end
            res = sub(res, 1, n)
        end
    else -- an array or anything else: not what the seize script answers
        sock:close()
        return nil, "unexpected reply " .. line, true
    end
    sock:setkeepalive(IDLE_MS, POOL)
    return res
end

-- Content handler of POST /market/consumer/coupon/seize.
function _M.seize()
    if ngx.req.get_method() ~= "POST" then
        return reply("METHOD_NOT_ALLOWED")
    end
    local user = token_user(ngx.var.http_authorization)
    if not user then
        return reply("UNAUTHORIZED")
    end
    local len = tonumber(ngx.var.http_content_length or "")
    if not len or len <= 0 then
        return reply("BAD_REQUEST")
    end
    if len > 1024 then
        return reply("TOO_LARGE")
    end
    local ct = ngx.var.http_content_type
    if not ct or not ct:lower():find("^application/json") then
        return reply("UNSUPPORTED_MEDIA_TYPE")
    end
    ngx.req.read_body()
    local body = cjson.decode(ngx.req.get_body_data() or "")
    local id = type(body) == "table" and body.id
    if type(id) ~= "number" or id < 1 or id >= MAX_ID or id ~= math.floor(id) then
        return reply("BAD_REQUEST")
    end
    local shard = id % 10
    local aid = format("%d", id)
    local args = {
        "EVALSHA", sha, "4",
        "COUPON:RESOURCE:STOCK:{" .. shard .. "}",
        "COUPON:SEIZE:LIST:" .. aid .. "_{" .. shard .. "}",
        "QUEUE:COUPON:SEIZE:SYNC:{" .. shard .. "}",
        "COUPON:ACTIVITY:WINDOW:{" .. shard .. "}",
        aid, user,
    }
    local res, err, sent = redis_call(args)
    if not res and sent and err and find(err, "^NOSCRIPT") then
        args[1], args[2] = "EVAL", script
        res, err, sent = redis_call(args)
    end
    if type(res) ~= "number" then
        -- Written and not answered: the script may have run (the
        -- product resends once; the peer only says so).
        if sent and not (err and find(err, "^[A-Z]+ ")) then
            return reply("UNKNOWN_OUTCOME", nil, 1)
        end
        return reply("UNAVAILABLE", nil, 1)
    end
    if res >= 0 then
        return reply("SEIZED", format('"activityId":%s,"remaining":%d', aid, res))
    end
    local code = OUTCOME[res]
    if not code then
        return reply("UNAVAILABLE", nil, 1)
    end
    return reply(code)
end

return _M
