#!/usr/bin/env bash
# stack.sh - the test stack itself: comes up healthy, is configured as shipped,
# and "down" leaves no process behind.
# shellcheck disable=SC2317,SC2119 # helpers are called through check/wait_for
set -u

. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

dead() { ! pid_alive "$1"; }
health_is_200() { [[ $(http_code GET /market/health) == 200 ]]; }
children() {
    if command -v pgrep >/dev/null 2>&1; then
        pgrep -P "$1" | tr '\n' ' '
    else
        cat "/proc/$1/task/$1/children" 2>/dev/null
    fi
}

cs_stack_up

check_eq "health answers 200" 200 "$(http_code GET /market/health)"
check_match "health is JSON" '^application/json' \
    "$(curl -s -o /dev/null -w '%{content_type}' "$COUPON_URL/market/health")"

# DIR/env: every name the other tests rely on is there and set.
for v in COUPON_URL COUPON_CONF COUPON_JWT_SECRET REDIS_HOST REDIS_PORT MYSQL_SOCKET \
    MYSQL_USER MYSQL_PASSWORD MYSQL_DATABASE MYSQL_PORT COUPON_DIR COUPON_FCGI_PID \
    COUPON_SYNC_PID COUPON_SYNC_CMD COUPON_NGINX_PID COUPON_REDIS_PID COUPON_MYSQL_PID \
    COUPON_REDIS_CMD COUPON_MYSQL_CMD COUPON_FCGI_SOCK; do
    if grep -q "^export $v=" "$COUPON_DIR/env" && [[ -n ${!v:-} ]]; then
        ok "env sets $v"
    else
        not_ok "env sets $v" "$(grep "$v=" "$COUPON_DIR/env" || echo missing)"
    fi
done
check_match "COUPON_URL is loopback" '^http://127\.0\.0\.1:[0-9]+$' "$COUPON_URL"
check_eq "jwt secret is 48 characters" 48 "${#COUPON_JWT_SECRET}"
check "fcgi socket exists" test -S "$COUPON_FCGI_SOCK"
for v in COUPON_REDIS_PID COUPON_MYSQL_PID COUPON_FCGI_PID COUPON_NGINX_PID COUPON_SYNC_PID; do
    check "$v is alive" pid_alive "${!v}"
done
conf_ok() { "$top_builddir/coupon-fcgi" -t -c "$COUPON_CONF" >/dev/null 2>&1; }
if [[ -x $top_builddir/coupon-fcgi ]]; then
    check "coupon-fcgi -t accepts the generated config" conf_ok
fi

# Redis runs with the shipped durability settings.
check_eq "redis appendonly" yes "$(rcli config get appendonly | sed -n 2p)"
check_eq "redis appendfsync" always "$(rcli config get appendfsync | sed -n 2p)"
check_eq "redis maxmemory-policy" noeviction "$(rcli config get maxmemory-policy | sed -n 2p)"
check_eq "redis binds loopback only" 127.0.0.1 "$(rcli config get bind | sed -n 2p)"

# coupon-fcgi checks the single Redis's durability as it checks cluster
# nodes: a gauge, and a warning in its log while it sells on.
aof_gauge() { http_get_body /market/admin/metrics | sed -n 's/^couponseize_redis_aof_always //p'; }
http_get_body() { curl -s --max-time 10 "$COUPON_URL$1"; }
check_eq "metrics: couponseize_redis_aof_always 1 with the shipped settings" 1 "$(aof_gauge)"
rcli config set appendfsync everysec >/dev/null
check_eq "metrics: ... 0 with appendfsync everysec" 0 "$(aof_gauge)"
check_match "the log says so, naming the setting" \
    "has appendfsync everysec, not always: .*sells all the same" "$(cat "$COUPON_DIR/fcgi.log")"
rcli config set appendfsync always >/dev/null

# MariaDB: schema applied, application user works over the socket and TCP.
tables=$(mysql_q "SHOW TABLES" | sort | tr '\n' ' ')
check_match "schema has activity and coupon" '(^| )activity .*coupon ' "$tables"
check_eq "migration 001 recorded" 1 \
    "$(mysql_q "SELECT COUNT(*) FROM schema_migration WHERE version = '001_schema'")"
check_eq "no demo data without --demo-data" 0 "$(mysql_q "SELECT COUNT(*) FROM activity")"
check_eq "app user over TCP" 1 "$(mariadb --no-defaults -h 127.0.0.1 -P "$MYSQL_PORT" \
    -u"$MYSQL_USER" -p"$MYSQL_PASSWORD" -N -B "$MYSQL_DATABASE" -e 'SELECT 1' 2>&1)"
check "mk_activity inserts a row" mk_activity 42 10 -60 3600
check_eq "mk_activity: in progress, full stock" "2	10	10" \
    "$(mysql_q "SELECT status, total_num, stock_num FROM activity WHERE id = 42")"

# nginx in front: ACL'd admin location reachable from loopback, JSON errors.
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: text/plain' \
    --data-binary x "$COUPON_URL/market/consumer/coupon/seize")
check_eq "nginx refuses a non-JSON body" 415 "$code"
code=$(head -c 4096 /dev/zero | tr '\0' 'x' | curl -s -o /dev/null -w '%{http_code}' \
    -X POST -H 'Content-Type: application/json' --data-binary @- \
    "$COUPON_URL/market/consumer/coupon/seize")
check_eq "nginx refuses a 4 KiB body" 413 "$code"
check "nginx config has no fastcgi_keep_conn" \
    bash -c "! grep -v '^ *#' '$COUPON_DIR/nginx/couponseize.conf' | grep -q fastcgi_keep_conn"

# mint_jwt produces a well-formed HS256 token that verifies with the secret.
tok=$(mint_jwt 1001 admin 60)
check_match "mint_jwt shape" '^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$' "$tok"
payload=$(testkit jwt-payload "$tok")
check_match "mint_jwt claims" '"sub":"1001".*"exp":[0-9]+.*"role":"admin"' "$payload"
check_eq "mint_jwt signature" "$(testkit jwt-sign "$COUPON_JWT_SECRET" "${tok%.*}")" "${tok##*.}"

# Fault helpers: a crashed Redis comes back on the same port with its data.
rcli set stack:probe kept >/dev/null
old=$COUPON_REDIS_PID
stack restart-redis --kill
check "restart-redis gives a new pid" test "$old" != "$COUPON_REDIS_PID"
check "old redis is gone" dead "$old"
check_eq "redis kept acknowledged writes" kept "$(rcli get stack:probe)"
check "health 200 after the redis restart" wait_for 10 health_is_200
stack stop-mysql
check_eq "stop-mysql clears the pid" "" "$COUPON_MYSQL_PID"
stack start-mysql
check "start-mysql brings it back" pid_alive "$COUPON_MYSQL_PID"
check_eq "data survives a mysql restart" 1 "$(mysql_q "SELECT COUNT(*) FROM activity WHERE id = 42")"
if [[ -n $COUPON_SYNC_PID ]]; then
    stack stop-sync
    check_eq "stop-sync clears the pid" "" "$COUPON_SYNC_PID"
    stack start-sync
    check "start-sync brings it back" pid_alive "$COUPON_SYNC_PID"
fi

# A daemon a test starts itself from DIR/env is stopped by "down" too.
extra=""
if [[ -x $top_builddir/coupon-sync ]]; then
    # shellcheck disable=SC2153 # from DIR/env
    $COUPON_SYNC_CMD 2>>"$COUPON_DIR/sync2.log" &
    extra=$!
    # "down" knows it by its executable: wait until the shell has exec'd it.
    is_sync() { [[ $(readlink "/proc/$extra/exe" 2>/dev/null) == */coupon-sync ]]; }
    check "the extra coupon-sync is running" wait_for 10 is_sync
fi

# A redis-server started from DIR and one that is not: "down" stops the first
# and leaves the second alone. (/proc/PID/exe of Debian's redis-server names
# redis-check-rdb, the file its link resolves to.)
stray="" bystander="" elsewhere=""
if command -v redis-server >/dev/null 2>&1; then
    (cd "$COUPON_DIR" && exec redis-server --port 0 --unixsocket "$COUPON_DIR/stray.sock" \
        --save '' --appendonly no >/dev/null 2>&1) &
    stray=$!
    elsewhere=$(mktemp -d "${TMPDIR:-/tmp}/cs-bystander.XXXXXX")
    (cd "$elsewhere" && exec redis-server --port 0 --unixsocket "$elsewhere/by.sock" \
        --save '' --appendonly no >/dev/null 2>&1) &
    bystander=$!
    # On every exit path, whatever "down" did: by socket path, not by pid (a
    # pid swept long ago may be another stack's process by then).
    cs_defer pkill -f "$COUPON_DIR/stray.sock"
    cs_defer pkill -f "$elsewhere/by.sock"
    cs_defer rm -rf "$elsewhere"
    stray_up() { [[ -S $COUPON_DIR/stray.sock && -S $elsewhere/by.sock ]]; }
    check "a stray and a bystander redis-server run" wait_for 10 stray_up
fi

# down: every recorded process, its children, and the extra daemons go away.
pids="$COUPON_REDIS_PID $COUPON_MYSQL_PID $COUPON_FCGI_PID $COUPON_NGINX_PID $COUPON_SYNC_PID $extra $stray"
for p in $COUPON_FCGI_PID $COUPON_NGINX_PID; do
    pids+=" $(children "$p")"
done
check_match "fcgi has forked workers" '[0-9]' "$(children "$COUPON_FCGI_PID")"
"$CS_STACK" down "$COUPON_DIR"
check_eq "down succeeds" 0 "$?"
left=""
for p in $pids; do
    if pid_alive "$p"; then left+="$p "; fi
done
check_eq "no process left after down" "" "$left"
if [[ -n $bystander ]]; then
    check "a redis-server not tied to DIR is left running" pid_alive "$bystander"
fi
check "fcgi socket removed" test ! -e "$COUPON_FCGI_SOCK"
check "shared memory removed" test ! -e "/dev/shm/${COUPON_SHM_NAME#/}"
"$CS_STACK" down "$COUPON_DIR"
check_eq "down twice is harmless" 0 "$?"

finish
