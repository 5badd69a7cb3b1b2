<?php
// seize.php - the PHP-FPM peer of coupon-fcgi's seize route, for benchmarks.
//
// It does what a typical PHP implementation of the same contract does, on
// the same keys with the same lua/seize.lua: checks the method, Content-Type
// and body, verifies the HS256 token, then one EVALSHA through phpredis over
// a persistent connection. Activity metadata (the window check) is not read,
// which only makes the peer cheaper than coupon-fcgi.
// Environment (from the FPM pool): COUPON_JWT_SECRET, REDIS_HOST, REDIS_PORT,
// COUPON_SCRIPT (path of lua/seize.lua), COUPON_SCRIPT_SHA (its SHA1).

header('Content-Type: application/json; charset=utf-8');
header('Cache-Control: no-store');

function reply(int $status, string $code, string $msg, array $extra = []): void
{
    http_response_code($status);
    echo json_encode(['code' => $code, 'msg' => $msg] + $extra);
    exit;
}

function b64url_decode(string $s): string|false
{
    return base64_decode(strtr($s, '-_', '+/') . str_repeat('=', (4 - strlen($s) % 4) % 4), true);
}

if ($_SERVER['REQUEST_METHOD'] !== 'POST') {
    reply(405, 'METHOD_NOT_ALLOWED', 'method not allowed on this route');
}
$auth = $_SERVER['HTTP_AUTHORIZATION'] ?? '';
if (strncasecmp($auth, 'Bearer ', 7) !== 0) {
    reply(401, 'UNAUTHORIZED', 'missing or invalid token');
}
$parts = explode('.', substr($auth, 7));
if (count($parts) !== 3) {
    reply(401, 'UNAUTHORIZED', 'malformed token');
}
$header = json_decode((string) b64url_decode($parts[0]), true);
$claims = json_decode((string) b64url_decode($parts[1]), true);
$sig = b64url_decode($parts[2]);
$want = hash_hmac('sha256', $parts[0] . '.' . $parts[1], getenv('COUPON_JWT_SECRET'), true);
if (!is_array($header) || ($header['alg'] ?? '') !== 'HS256' || !is_array($claims)
    || $sig === false || !hash_equals($want, $sig)
    || !is_int($claims['exp'] ?? null) || $claims['exp'] <= time()
    || !preg_match('/^[1-9][0-9]{0,18}$/', (string) ($claims['sub'] ?? ''))) {
    reply(401, 'UNAUTHORIZED', 'missing or invalid token');
}
$user = $claims['sub'];

$len = (int) ($_SERVER['CONTENT_LENGTH'] ?? 0);
if ($len <= 0) {
    reply(400, 'BAD_REQUEST', 'request body is empty');
}
if ($len > 1024) {
    reply(413, 'TOO_LARGE', 'request body too large');
}
if (stripos($_SERVER['CONTENT_TYPE'] ?? '', 'application/json') !== 0) {
    reply(415, 'UNSUPPORTED_MEDIA_TYPE', 'Content-Type must be application/json');
}
$body = json_decode(file_get_contents('php://input'), true, 4, JSON_BIGINT_AS_STRING);
$id = is_array($body) ? ($body['id'] ?? null) : null;
if (!is_int($id) || $id < 1) {
    reply(400, 'BAD_REQUEST', 'id must be an integer 1..9223372036854775807');
}

$redis = new Redis();
try {
    $redis->pconnect(getenv('REDIS_HOST'), (int) getenv('REDIS_PORT'), 0.2);
    $redis->setOption(Redis::OPT_READ_TIMEOUT, 0.2);
    $shard = $id % 10;
    $keys = ["COUPON:RESOURCE:STOCK:{{$shard}}", "COUPON:SEIZE:LIST:{$id}_{{$shard}}",
             "QUEUE:COUPON:SEIZE:SYNC:{{$shard}}", "COUPON:ACTIVITY:WINDOW:{{$shard}}"];
    $args = array_merge($keys, [(string) $id, $user]);
    $res = $redis->evalSha(getenv('COUPON_SCRIPT_SHA'), $args, 4);
    if ($res === false && str_starts_with((string) $redis->getLastError(), 'NOSCRIPT')) {
        $redis->clearLastError();
        $res = $redis->eval(file_get_contents(getenv('COUPON_SCRIPT')), $args, 4);
    }
} catch (RedisException $e) {
    header('Retry-After: 1');
    reply(503, 'UNAVAILABLE', 'service temporarily unavailable, retry later');
}
if (!is_int($res)) {
    header('Retry-After: 1');
    reply(503, 'UNAVAILABLE', 'service temporarily unavailable, retry later');
}
switch ($res) {
case -1: reply(409, 'ALREADY_SEIZED', 'one coupon per user per activity');
case -2: reply(409, 'SOLD_OUT', 'all coupons of this activity are gone');
case -3: reply(404, 'NO_SUCH_ACTIVITY', 'no such activity');
case -4: reply(409, 'NOT_STARTED', 'the activity has not started yet');
case -5: reply(409, 'ENDED', 'the activity has ended');
default: reply(200, 'SEIZED', 'you got a coupon', ['activityId' => $id, 'remaining' => $res]);
}
