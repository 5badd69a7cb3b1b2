# tests/lib.sh - helpers for the integration tests; source it, don't run it.
#
#   . "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"
#   cs_stack_up [--no-sync] [--no-web] [--demo-data]   # exports DIR/env
#   check_eq "health answers 200" 200 "$(http_code GET /market/health)"
#   finish
#
# Results are printed TAP-style ("ok 3 - name" / "not ok 4 - name" plus
# "# ..." diagnostics). Exit codes follow automake: 0 pass, 1 fail, 77 skip,
# 99 hard error (the stack could not be started).
#
# KEEP=1 keeps the stack's directory (logs, data) after the test; the stack
# itself is always stopped. KEEP=up leaves it running too ("tests/stack down
# DIR" stops it later).

# shellcheck shell=bash

: "${top_srcdir:=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
export top_srcdir top_builddir
CS_STACK=$top_srcdir/tests/stack

CS_N=0
CS_PASS=0
CS_FAIL=0
CS_CLEANUP=()

# --- results ------------------------------------------------------------------

ok() {
    cs_not_run && return 0
    CS_N=$((CS_N + 1)) CS_PASS=$((CS_PASS + 1))
    printf 'ok %d - %s\n' "$CS_N" "$1"
}

# not_ok NAME [DIAGNOSTIC...]
not_ok() {
    cs_not_run && return 0
    local name=$1 line
    shift
    CS_N=$((CS_N + 1)) CS_FAIL=$((CS_FAIL + 1))
    printf 'not ok %d - %s\n' "$CS_N" "$name"
    for line in "$@"; do
        printf '#   %s\n' "$line"
    done
}

# check_eq NAME EXPECTED ACTUAL
check_eq() {
    if [[ $2 == "$3" ]]; then
        ok "$1"
    else
        not_ok "$1" "expected: $2" "     got: $3"
    fi
}

# check_match NAME REGEX ACTUAL (bash =~, extended regex)
check_match() {
    if [[ $3 =~ $2 ]]; then
        ok "$1"
    else
        not_ok "$1" "expected to match: $2" "                got: $3"
    fi
}

# check NAME CMD...: passes when CMD succeeds.
check() {
    cs_not_run && return 0
    local name=$1
    shift
    if "$@"; then
        ok "$name"
    else
        not_ok "$name" "failed: $*"
    fi
}

diag() { printf '# %s\n' "$*"; }

# testkit SUBCOMMAND ARGS...: the helpers that need more than the shell
# (proxies, socket listeners, JSON paths, Prometheus queries; "testkit -h"
# lists them). A server of it started in the background is run as
# python3 "$CS_TESTKIT" ... &, so that $! is python itself.
# checker SUBCOMMAND ARGS...: the judges of answers, logs and journals
# (tests/nemesis/checker.py, unit-tested in tests/nemesis/test_checker.py).
CS_TESTKIT=$top_srcdir/tests/testkit.py
testkit() { python3 "$CS_TESTKIT" "$@"; }
checker() { python3 "$top_srcdir/tests/nemesis/checker.py" "$@"; }

# lua_text NAME: lua/NAME.lua as coupon-fcgi sends it, each
# "--#include part/X.lua" line replaced by that part (Makefile.am joins them
# so for lib/scripts.c).
lua_text() {
    awk -v dir="$top_srcdir/lua" '/^--#include /{ p = dir "/" $2; \
        while ((getline l < p) > 0) print l; close(p); next } { print }' "$top_srcdir/lua/$1.lua"
}

# --- preconditions and sections ----------------------------------------------
#
# A check that later checks depend on is a precondition: when it fails, the
# checks after it would fail too, each for the same cause, and a log of ten
# failures names none. require stops there, with one message:
#
#   section "(d) a worker killed mid-grant"
#   require "(d) node 2 sells from its reserve" wait_for 5 node_health_says n2 reserve
#   check_eq ...            # not run (and counted as such) once the require failed
#   section -i "(f) ..."    # -i: does not depend on (d); a plain section does
#
# Within a stopped section the script's actions still run (stopping nodes,
# restarting Redis: the state the next section starts from), its checks do
# not: check, check_eq, check_match, ok and not_ok are counted as not run,
# and check's command (a wait) is not run at all. A section that follows a
# stopped one ends the script unless it was declared independent (-i);
# outside any section a failed require ends the script at once.
CS_SECTION=""
CS_STOPPED=""
CS_NOT_RUN=0
CS_STOPS=()

# cs_not_run: true while a failed precondition stops the section (and then
# counts one check not run).
cs_not_run() {
    [[ -n $CS_STOPPED ]] || return 1
    CS_NOT_RUN=$((CS_NOT_RUN + 1))
    return 0
}

# cs_section_end: closes the section; says what a failed precondition left
# unchecked.
cs_section_end() {
    if [[ -n $CS_STOPPED ]]; then
        diag "section ${CS_SECTION:-(the script)}: $CS_NOT_RUN checks not run after the failed" \
            "precondition \"$CS_STOPPED\""
        CS_STOPS+=("$CS_STOPPED ($CS_NOT_RUN checks after it not run)")
    fi
    CS_STOPPED="" CS_NOT_RUN=0
}

# section [-i] NAME: the checks from here to the next section are NAME's.
# Without -i, NAME depends on the sections before it: when one of them was
# stopped by a failed precondition, the script ends here.
section() {
    local indep=0
    [[ $1 == -i ]] && { indep=1; shift; }
    cs_section_end
    if ((indep == 0 && ${#CS_STOPS[@]} > 0)); then
        diag "section $1 depends on one stopped before it: the script ends here"
        finish
    fi
    CS_SECTION=$1
}

# require NAME CMD...: check NAME CMD...; when it fails, the rest of the
# section (outside any section: the script) is not checked: the checks
# after it depend on it. Returns CMD's status (0 when not run).
require() {
    cs_not_run && return 0
    local name=$1
    shift
    if "$@"; then
        ok "$name"
        return 0
    fi
    not_ok "$name" "failed: $*" "a precondition: what depends on it is not checked"
    CS_STOPPED=$name
    if [[ -z $CS_SECTION ]]; then
        cs_section_end
        finish
    fi
    diag "section $CS_SECTION stops checking here: its checks after this depend on it"
    return 1
}

# finish: prints the plan and the totals; exits 1 when anything failed.
finish() {
    cs_section_end
    local s
    for s in "${CS_STOPS[@]}"; do diag "stopped at a failed precondition: $s"; done
    printf '1..%d\n' "$CS_N"
    printf '# took %d s (CS_TIME_SCALE %s at the start, up to %s during waits)\n' "$SECONDS" \
        "${CS_TIME_SCALE:-1}" "$CS_SLOW_MAX"
    echo "$CS_PASS passed, $CS_FAIL failed"
    if ((CS_FAIL > 0)); then exit 1; fi
    exit 0
}

# skip_unless_cmd CMD...: returns 77 (and says why) when a CMD is missing:
#   skip_unless_cmd wrk || exit 77
skip_unless_cmd() {
    local c
    for c in "$@"; do
        if ! command -v "$c" >/dev/null 2>&1; then
            echo "SKIP: $c is not installed"
            return 77
        fi
    done
    return 0
}

# skip ALL: ends the test as skipped.
skip_all() {
    echo "1..0 # SKIP $*"
    exit 77
}

# --- the stack ----------------------------------------------------------------

# cs_defer CMD...: runs CMD at exit, before the stack goes down.
cs_defer() { CS_CLEANUP+=("$(printf '%q ' "$@")"); }

cs_cleanup() {
    local rc=$? c
    trap - EXIT
    for c in "${CS_CLEANUP[@]}"; do
        eval "$c" || true
    done
    if [[ -n ${COUPON_DIR:-} && -d $COUPON_DIR ]]; then
        if [[ ${KEEP:-} == up ]]; then
            echo "# KEEP=up: stack still running in $COUPON_DIR (. $COUPON_DIR/env;" \
                "tests/stack down $COUPON_DIR)" >&2
        else
            if ((rc != 0 && rc != 77)); then cs_show_logs >&2; fi
            "$CS_STACK" down "$COUPON_DIR" >&2 || true
            if [[ ${KEEP:-} == 1 ]]; then
                echo "# KEEP=1: stack directory kept: $COUPON_DIR" >&2
            else
                rm -rf "$COUPON_DIR"
            fi
        fi
    fi
    exit "$rc"
}

# cs_show_logs: the ends of the stack's logs (printed when a test fails).
cs_show_logs() {
    local f
    for f in "$COUPON_DIR/fcgi.log" "$COUPON_DIR/sync.log" "$COUPON_DIR/nginx/error.log" \
        "$COUPON_DIR/redis/redis.log" "$COUPON_DIR/mysql/error.log"; do
        [[ -s $f ]] || continue
        echo "# ---- last lines of $f ----"
        tail -n 30 "$f" | sed 's/^/# /'
    done
}

# cs_stack_up [tests/stack up options]: starts a stack in a fresh temporary
# directory, sources its env (COUPON_URL, REDIS_PORT, ... see tests/stack) and
# arranges for it to be stopped and removed on exit. Skips (77) when a server
# is not installed; exits 99 when the stack does not come up.
cs_stack_up() {
    local -a need=(redis-server redis-cli mariadb-install-db mariadb curl)
    [[ " $* " == *" --no-web "* ]] || need+=(nginx)
    local c
    for c in "${need[@]}"; do
        command -v "$c" >/dev/null 2>&1 || [[ -x /usr/sbin/$c ]] || skip_all "$c is not installed"
    done
    command -v mariadbd >/dev/null 2>&1 || [[ -x /usr/sbin/mariadbd ]] ||
        command -v mysqld >/dev/null 2>&1 || skip_all "mariadbd is not installed"

    COUPON_DIR=$(mktemp -d "${TMPDIR:-/tmp}/cs-test.XXXXXX") || exit 99
    export COUPON_DIR
    trap cs_cleanup EXIT
    trap 'exit 130' INT TERM
    if ! "$CS_STACK" up "$COUPON_DIR" "$@"; then
        echo "Bail out! tests/stack up failed"
        exit 99
    fi
    # shellcheck source=/dev/null
    . "$COUPON_DIR/env"
}

# cs_reload_env: re-reads DIR/env after a stop-*/start-* helper changed pids.
cs_reload_env() {
    # shellcheck source=/dev/null
    . "$COUPON_DIR/env"
}

# stack CMD [ARGS]: runs a tests/stack helper on this test's stack and
# re-reads DIR/env, e.g. "stack restart-redis --kill".
stack() {
    local cmd=$1
    shift
    "$CS_STACK" "$cmd" "$COUPON_DIR" "$@"
    local rc=$?
    cs_reload_env
    return "$rc"
}

# --- clients --------------------------------------------------------------------

rcli() { redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" "$@"; }

# mysql_q SQL: runs SQL as the application user; rows tab-separated, no header.
# (--host=localhost: the socket is used even when MYSQL_HOST is set around us.)
mysql_q() {
    mariadb --no-defaults --host=localhost --socket="$MYSQL_SOCKET" -u"$MYSQL_USER" \
        -p"$MYSQL_PASSWORD" -N -B "$MYSQL_DATABASE" -e "$1"
}

# mysql_root_q SQL: runs SQL as the stack's MariaDB root, for what a test
# does beyond the application's grant (deleting rows it planted).
mysql_root_q() {
    mariadb --no-defaults --host=localhost --socket="$MYSQL_SOCKET" -uroot \
        -N -B "$MYSQL_DATABASE" -e "$1"
}

# mk_activity ID TOTAL START_OFFSET_S END_OFFSET_S [STATUS]: inserts an
# activity whose distribution window is NOW()+START .. NOW()+END seconds. The
# status follows from the window (1 not started, 2 in progress, 3 ended)
# unless given.
mk_activity() {
    local id=$1 total=$2 start=$3 end=$4 status=${5:-}
    local v
    for v in "$id" "$total" "$start" "$end" ${status:+"$status"}; do
        [[ $v =~ ^-?[0-9]+$ ]] || { echo "mk_activity: '$v' is not an integer" >&2; return 1; }
    done
    if [[ -z $status ]]; then
        if ((start > 0)); then status=1; elif ((end > 0)); then status=2; else status=3; fi
    fi
    mysql_q "INSERT INTO activity (id, name, total_num, stock_num, distribute_start_time,
        distribute_end_time, validity_days, status)
        VALUES ($id, 'test activity $id', $total, $total, NOW() + INTERVAL $start SECOND,
        NOW() + INTERVAL $end SECOND, 30, $status)"
}

# sql_is SQL EXPECTED: the query's answer is EXPECTED (for wait_for).
sql_is() { [[ $(mysql_q "$1") == "$2" ]]; }

# b64url: stdin as unpadded base64url (one process: tokens are minted by the
# thousand in a run).
b64url() {
    local s
    s=$(base64 -w0)
    s=${s//+/-}
    s=${s//\//_}
    printf '%s' "${s%%=*}"
}

# mint_jwt SUB [ROLE] [EXP_OFFSET_S]: prints an HS256 token signed with
# $COUPON_JWT_SECRET: sub = SUB, exp = now + EXP_OFFSET_S (default 3600;
# negative for an expired token, "none" for no exp claim), role = ROLE when
# not empty. JWT_SECRET overrides the key (forged tokens), JWT_ALG the header
# alg (the signature stays HS256), JWT_EXTRA more claims (a JSON fragment
# such as '"groups":["vip"]').
CS_OPENSSL=$(command -v openssl || true)
# Filled here, not in mint_jwt: callers run it in $(...), whose assignments
# are lost.
declare -A CS_JWT_HEADER
CS_JWT_HEADER[HS256]=$(printf '{"alg":"HS256","typ":"JWT"}' | b64url)
mint_jwt() {
    local sub=$1 role=${2:-} off=${3:-3600} now header payload input sig
    local key=${JWT_SECRET:-$COUPON_JWT_SECRET} alg=${JWT_ALG:-HS256}
    now=${EPOCHSECONDS:-$(date +%s)}
    if [[ -z ${CS_JWT_HEADER[$alg]:-} ]]; then
        CS_JWT_HEADER[$alg]=$(printf '{"alg":"%s","typ":"JWT"}' "$alg" | b64url)
    fi
    header=${CS_JWT_HEADER[$alg]}
    printf -v payload '{"sub":"%s","iat":%d' "$sub" "$now"
    if [[ $off != none ]]; then printf -v payload '%s,"exp":%d' "$payload" $((now + off)); fi
    if [[ -n $role ]]; then printf -v payload '%s,"role":"%s"' "$payload" "$role"; fi
    if [[ -n ${JWT_EXTRA:-} ]]; then payload+=",$JWT_EXTRA"; fi
    payload=$(printf '%s}' "$payload" | b64url)
    input=$header.$payload
    if [[ -n $CS_OPENSSL ]]; then
        sig=$(printf '%s' "$input" | openssl dgst -sha256 -hmac "$key" -binary | b64url)
    else
        sig=$(testkit jwt-sign "$key" "$input")
    fi
    printf '%s.%s\n' "$input" "$sig"
}

# http METHOD PATH [JSON_BODY] [TOKEN]: requests $COUPON_URL$PATH; sets
# HTTP_CODE and HTTP_BODY (and HTTP_HEADERS). A body is sent as
# application/json.
http() {
    local method=$1 path=$2 body=${3:-} token=${4:-} out hdr
    local -a args=(-s -X "$method" --max-time 10 -D -)
    [[ -n $body ]] && args+=(-H 'Content-Type: application/json' --data-binary "$body")
    [[ -n $token ]] && args+=(-H "Authorization: Bearer $token")
    out=$(curl "${args[@]}" -w '\n%{http_code}' "$COUPON_URL$path") || true
    HTTP_CODE=${out##*$'\n'}
    out=${out%$'\n'*}
    hdr=${out%%$'\r\n\r\n'*}
    # shellcheck disable=SC2034 # results for the caller
    HTTP_HEADERS=$hdr
    # shellcheck disable=SC2034
    HTTP_BODY=${out#*$'\r\n\r\n'}
}

# node_up NAME [KEY=VALUE ...]: a further coupon-fcgi node of this stack in
# $COUPON_DIR/NAME: the stack's configuration with its own socket, shared
# memory, journal and 2 workers (KEY=VALUE: more "key = value;" lines to
# change, e.g. host='"127.0.1.20"'), on the same Redis and MySQL; stopped on
# exit. Sets NODE_SOCK_<NAME> and NODE_PID_<NAME>. Extra environment for it:
# NODE_ENV (e.g. "COUPONSEIZE_FAULT=...").
node_up() {
    local name=$1 dir=$COUPON_DIR/$1 kv
    shift
    mkdir -p "$dir"
    local -a sed_args=(-e "s|^\( *listen = \).*|\1\"$dir/fcgi.sock\";|"
        -e "s|^\( *workers = \).*|\12;|"
        -e "s|^\( *shm_name = \).*|\1\"/couponseize-$name-$$\";|"
        -e "s|^\( *journal = \).*|\1\"$dir/journal\";|")
    for kv in "$@"; do sed_args+=(-e "s|^\( *${kv%%=*} = \).*|\1${kv#*=};|"); done
    sed "${sed_args[@]}" "$COUPON_CONF" >"$dir/couponseize.conf"
    # shellcheck disable=SC2086 # NODE_ENV: words of VAR=VALUE
    env ${NODE_ENV:-} "$top_builddir/coupon-fcgi" -c "$dir/couponseize.conf" \
        >>"$dir/fcgi.log" 2>&1 </dev/null &
    printf -v "NODE_PID_$name" '%s' "$!"
    printf -v "NODE_SOCK_$name" '%s' "$dir/fcgi.sock"
    cs_defer node_down "$name"
    wait_for 20 test -S "$dir/fcgi.sock" || {
        not_ok "node $name starts" "$(tail -n 5 "$dir/fcgi.log")"
        return 1
    }
    # With reserves on, its keeper names the incarnation (read by the tests
    # right after) a moment after the socket is there.
    if ! grep -q '^ *reserve = 0;' "$dir/couponseize.conf"; then
        wait_for 20 test -s "$dir/journal/incarnation" || {
            not_ok "node $name names its incarnation" "$(tail -n 5 "$dir/fcgi.log")"
            return 1
        }
    fi
}

# node_down NAME [SIGNAL]: stops node NAME (TERM: a graceful stop; KILL: the
# whole node at once, supervisor, workers and keeper).
node_down() {
    local name=$1 sig=${2:-TERM} pidvar="NODE_PID_$1" pid
    pid=${!pidvar:-}
    [[ -n $pid ]] || return 0
    # A node that ended by itself: its number may be someone else's now.
    own_child "$pid" || { printf -v "$pidvar" '%s' ""; return 0; }
    if [[ $sig == KILL ]]; then
        # Frozen first: a supervisor left running between its children's
        # death and its own would restart the keeper, which then gives the
        # reserves back gracefully on its parent's death (PDEATHSIG).
        kill -STOP "$pid" 2>/dev/null
        pkill -KILL -P "$pid" 2>/dev/null
        kill -KILL "$pid" 2>/dev/null
    else
        kill -TERM "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
    rm -f "$COUPON_DIR/$name/fcgi.sock"
    [[ $sig == KILL ]] || rm -f "/dev/shm/couponseize-$name-$$"*
    printf -v "$pidvar" '%s' ""
    return 0
}

# node_signal NAME SIG: sends SIG to node NAME's supervisor, then to its
# workers and keeper (STOP freezes the whole node, CONT thaws it).
node_signal() {
    local pidvar="NODE_PID_$1"
    own_child "${!pidvar:-}" || return 0
    kill -"$2" "${!pidvar}" 2>/dev/null
    pkill -"$2" -P "${!pidvar}" 2>/dev/null
    return 0
}

# node_http NAME METHOD PATH [JSON_BODY] [TOKEN]: http() straight to node
# NAME's FastCGI socket (cgi-fcgi); sets HTTP_CODE and HTTP_BODY. Gives up
# after NODE_HTTP_TIMEOUT seconds (10).
node_http() {
    local sockvar="NODE_SOCK_$1" method=$2 uri=$3 body=${4:-} token=${5:-} out path query=""
    path=${uri%%\?*}
    [[ $uri == *\?* ]] && query=${uri#*\?}
    out=$(printf '%s' "$body" | env -i REQUEST_METHOD="$method" REQUEST_URI="$uri" \
        SCRIPT_NAME="$path" QUERY_STRING="$query" SERVER_PROTOCOL=HTTP/1.1 \
        GATEWAY_INTERFACE=CGI/1.1 REMOTE_ADDR=127.0.0.1 SERVER_NAME=localhost \
        CONTENT_LENGTH="${#body}" CONTENT_TYPE="${body:+application/json}" \
        ${token:+HTTP_AUTHORIZATION="Bearer $token"} \
        timeout "${NODE_HTTP_TIMEOUT:-10}" cgi-fcgi -bind -connect "${!sockvar}" 2>/dev/null) || true
    # Headers and body split in the shell (no sed: a test sends hundreds).
    local head=$out sep
    # shellcheck disable=SC2034
    HTTP_BODY=
    for sep in $'\r\n\r\n' $'\n\n' $'\n\r\n'; do
        if [[ $out == *"$sep"* ]]; then
            head=${out%%"$sep"*}
            HTTP_BODY=${out#*"$sep"}
            break
        fi
    done
    HTTP_CODE=200
    local re=$'(^|\n)Status: ([0-9]+)'
    [[ $head =~ $re ]] && HTTP_CODE=${BASH_REMATCH[2]}
}

# http_code METHOD PATH [JSON_BODY] [TOKEN]: prints only the status code.
http_code() {
    http "$@"
    printf '%s\n' "$HTTP_CODE"
}

# json_get JSON KEY: prints the value of top-level KEY (strings unquoted,
# everything else as JSON); empty when absent.
json_get() {
    # Every answer of the API opens with its code: read that one without a
    # python3 start (a test reads thousands), when the body is a flat object
    # of plain values (anything else, a cut body included, goes to python).
    local flat='^\{"code":"([A-Z_]+)"(,"[A-Za-z_]+":("[^"\\]*"|-?[0-9]+|true|false|null))*\}$'
    if [[ $2 == code && $1 =~ $flat ]]; then
        printf '%s\n' "${BASH_REMATCH[1]}"
        return 0
    fi
    testkit json-get "$1" "$2"
}

# jat JSON a.b.0.c: the value at a dotted path, list indexes as numbers
# (strings unquoted, everything else as JSON); empty when absent.
jat() { testkit jat "$1" "$2" 2>/dev/null; }

# iso OFFSET_S: now + OFFSET_S seconds as RFC 3339 UTC.
iso() { date -u -d "@$(($(date +%s) + $1))" +%Y-%m-%dT%H:%M:%SZ; }

# proc_state PID: the one-letter state of process PID (R, S, T, Z, ...) in
# PSTATE, read from /proc without a fork; fails when there is no such process.
proc_state() {
    local s
    [[ -n $1 ]] || return 1
    { read -r s <"/proc/$1/stat"; } 2>/dev/null || return 1
    s=${s##*) }
    PSTATE=${s:0:1}
}

# own_child PID: PID is still a child of this test's shell. Signal a pid
# the test started only when it is: once that process has ended and been
# reaped, the kernel gives its number to someone else (pids here wrap
# around 32768 within minutes while two test stacks run), and a TERM at exit
# to a load that ended long ago once stopped a neighbour's "make check".
own_child() {
    local s
    [[ $1 =~ ^[0-9]+$ ]] || return 1
    { read -r s <"/proc/$1/stat"; } 2>/dev/null || return 1
    s=${s##*) }
    s=${s#* }
    [[ ${s%% *} == "$$" || ${s%% *} == "$BASHPID" ]]
}

# pid_alive PID: the process exists and is not a zombie.
pid_alive() {
    proc_state "$1" && [[ $PSTATE != Z && $PSTATE != X ]]
}

# CS_TIME_SCALE: how many times slower than idle this machine runs now, from
# the load average per core when the test starts (1 .. 4; set it to choose).
# Deadlines of things that arrive "eventually" scale with it; what a check
# asserts never does. A load that starts later is not in it: wait_for and
# cs_slowness measure the machine again while the test runs.
CS_NCPU=$(nproc 2>/dev/null || echo 1)
if [[ -z ${CS_TIME_SCALE:-} ]]; then
    CS_TIME_SCALE=$(awk -v n="$CS_NCPU" '{
        s = int($1 / n + 0.999); if (s < 1) s = 1; if (s > 4) s = 4; print s }' /proc/loadavg \
        2>/dev/null || echo 1)
fi
export CS_TIME_SCALE
# The most a deadline is stretched by a slowness measured during the test.
CS_SLOW_CAP=${CS_SLOW_CAP:-6}
CS_SLOW_MAX=$CS_TIME_SCALE

# cs_runnable: the tasks runnable on this machine now, not counting the
# shell asking (the fourth field of /proc/loadavg), in CS_RUNNABLE; read
# without a fork, for polls.
cs_runnable() {
    local _l1 _l5 _l15 rq
    { read -r _l1 _l5 _l15 rq _ </proc/loadavg; } 2>/dev/null || { CS_RUNNABLE=0; return 0; }
    CS_LOAD1=$_l1
    CS_RUNNABLE=$((${rq%/*} - 1))
    ((CS_RUNNABLE >= 0)) || CS_RUNNABLE=0
}

# cs_slow_of RUNNABLE_X100: CS_SLOW, the slowness (1 .. CS_SLOW_CAP) of a machine
# with that many runnable tasks (x 100) for CS_NCPU cores: a task gets a core
# a 1 / (runnable / cores) share of the time once they are more than the
# cores. The load average of the last minute (CS_LOAD1) counts too: it
# remembers a load that a few samples may miss.
cs_slow_of() {
    local r=$1 l s
    l=${CS_LOAD1:-0}
    l=$((10#${l%.*} * 100 + 10#${l#*.}))
    ((l > r)) || l=$r
    s=$(((l + 100 * CS_NCPU - 1) / (100 * CS_NCPU)))
    ((s >= 1)) || s=1
    ((s <= CS_SLOW_CAP)) || s=$CS_SLOW_CAP
    CS_SLOW=$s
}

# cs_slowness [SECONDS]: prints how many times slower than idle the machine
# runs now (1 .. CS_SLOW_CAP), from the runnable tasks sampled for SECONDS
# (default 1) and the last minute's load average, and never less than
# CS_TIME_SCALE. For a deadline or a lease chosen mid-test (a node started
# late, a load about to run), where the start's measure may be stale.
cs_slowness() {
    local i n=$((${1:-1} * 10)) sum=0 s
    ((n >= 1)) || n=1
    for ((i = 0; i < n; i++)); do
        cs_runnable
        sum=$((sum + CS_RUNNABLE))
        ((i + 1 < n)) && nap 0.1
    done
    cs_slow_of $((sum * 100 / n))
    s=$CS_SLOW
    ((s >= CS_TIME_SCALE)) || s=$CS_TIME_SCALE
    ((s <= CS_SLOW_MAX)) || CS_SLOW_MAX=$s
    echo "$s"
}

# nap SECONDS: sleeps without a fork: a read with a timeout on a FIFO that
# this shell holds open at both ends, so nothing ever arrives. On these VMs
# a fork costs about as much as what a poll checks, and the polls of one
# test (a "sleep" each) kept a core busy: reserve_tokens.sh alone used 61 s
# of CPU in 52 s. The FIFO is made on first use and unlinked at once.
nap() {
    if [[ -z ${CS_NAP_FD:-} ]]; then
        local f
        f=$(mktemp -u "${TMPDIR:-/tmp}/csnap.XXXXXX")
        mkfifo -m 600 "$f" || { sleep "$1"; return 0; }
        exec {CS_NAP_FD}<>"$f"
        rm -f "$f"
    fi
    read -r -t "$1" -u "$CS_NAP_FD" _ || true
}

# wait_for TIMEOUT_S CMD...: polls CMD every 0.1 s (CS_POLL) until it
# succeeds, for at most TIMEOUT_S x the machine's slowness: CS_TIME_SCALE
# (measured at the start), or more when the machine is slower while it
# waits: each poll samples the runnable tasks, and the deadline follows
# their mean over the wait (and the last minute's load average), up to
# CS_SLOW_CAP. A wait that runs out says so on stderr (in the test's log),
# with what it waited for and the slowness it allowed for.
wait_for() {
    local t0 now limit=$1 scale=${CS_TIME_SCALE:-1} sum=0 n=0
    t0=${EPOCHREALTIME/./}
    shift
    until "$@"; do
        cs_runnable
        sum=$((sum + CS_RUNNABLE)) n=$((n + 1))
        cs_slow_of $((sum * 100 / n))
        ((CS_SLOW <= scale)) || scale=$CS_SLOW
        now=${EPOCHREALTIME/./}
        if (((now - t0) / 1000 >= limit * 1000 * scale)); then
            ((scale <= CS_SLOW_MAX)) || CS_SLOW_MAX=$scale
            printf '# wait_for: gave up after %d.%01d s (%s s x slowness %s): %s\n' \
                $(((now - t0) / 1000000)) $(((now - t0) / 100000 % 10)) "$limit" "$scale" "$*" >&2
            return 1
        fi
        nap "${CS_POLL:-0.1}"
    done
    ((scale <= CS_SLOW_MAX)) || CS_SLOW_MAX=$scale
    return 0
}

# server_max_ms FROM_MS TO_MS [URI]: the longest time nginx held a request
# for URI (default the seize route) that ended between FROM_MS and TO_MS
# (epoch ms), in ms, from the stack's access log (COUPON_ACCESS_LOG=1). The
# budget is the server's promise, from when the web server got the request:
# a client's own delays on a loaded machine are not in it.
server_max_ms() {
    awk -v from="$1" -v to="$2" -v uri="${3:-/market/consumer/coupon/seize}" '
        { t = $1 * 1000; if (t >= from && t <= to && $4 == uri && $3 * 1000 > m) m = $3 * 1000 }
        END { printf "%d\n", m }' "$COUPON_DIR/nginx/access.log"
}

# server_p99_ms FROM_MS TO_MS [URI]: the same log's 99th percentile of those
# times, in ms.
server_p99_ms() {
    awk -v from="$1" -v to="$2" -v uri="${3:-/market/consumer/coupon/seize}" '
        { t = $1 * 1000; if (t >= from && t <= to && $4 == uri) print int($3 * 1000) }' \
        "$COUPON_DIR/nginx/access.log" | sort -n | awk '{ v[NR] = $1 }
        END { k = int(NR * 0.99) + 1; if (k > NR) k = NR; print (NR == 0 ? -1 : v[k]) }'
}

# answers LOG: how many answers a loadgen run has logged (-L LOG) so far.
answers() { local n; n=$(grep -vc '^#' "$1" 2>/dev/null) || true; echo "${n:-0}"; }

# wait_answers LOG N [TIMEOUT_S]: returns once the load logging to LOG has
# answered N more requests than when called (1 when the deadline, default
# 60 s x CS_TIME_SCALE, passed first). A load window measured in answers,
# not in seconds: on a slow machine a fixed sleep may hold a handful.
wait_answers() {
    local wa_log=$1 wa_want
    wa_want=$(($(answers "$1") + $2))
    # shellcheck disable=SC2016 # expanded by wait_for's eval, in this scope
    wait_for "${3:-60}" eval '(($(answers "$wa_log") >= wa_want))'
}

# wait_past_ms EPOCH_MS: returns once this machine's clock is past EPOCH_MS. A
# wait for a moment (a sale's end, an expiry), judged by the clock rather than
# by how long a sleep happened to take.
wait_past_ms() {
    local left
    while left=$(($1 - $(date +%s%3N) + 1)); ((left > 0)); do
        sleep "$(printf '%d.%03d' $((left / 1000)) $((left % 1000)))"
    done
}

# A keeper run with COUPONSEIZE_PAUSE_AT=keeper-decide stops itself after
# each pass's replay, before its decisions. keeper_held: node KEEPER_NODE's
# keeper is stopped there (the one child of its supervisor that stops); sets
# KEEPER_PID, for wait_for. keeper_go lets it go on at every stop (while
# the file GO exists), keeper_hold holds it at the next one.
# No fork in either (they poll every 20 ms): the children and states are
# read from /proc with read, and the wait is a nap.
keeper_held() {
    local c pid=NODE_PID_${KEEPER_NODE:?} kids=()
    { read -r -a kids <"/proc/${!pid}/task/${!pid}/children"; } 2>/dev/null
    for c in "${kids[@]}"; do
        proc_state "$c" && [[ $PSTATE == T ]] && { KEEPER_PID=$c; return 0; }
    done
    return 1
}
keeper_go() {
    touch "${GO:?}"
    (while [[ -e $GO ]]; do
        keeper_held && kill -CONT "$KEEPER_PID"
        nap 0.02
    done) &
    GO_PID=$!
}
keeper_hold() {
    rm -f "${GO:?}"
    wait "$GO_PID"
    wait_for 20 keeper_held
}

# end_soon ID [SECONDS]: activity ID ends SECONDS (2) from now: its end moved
# in MySQL, as a change by hand (the admin API refuses an earlier end once a
# sale has started), and preheated into Redis. A test opens a sale for as
# long as its steps need, then ends it without waiting out a fixed window.
end_soon() {
    mysql_q "UPDATE activity SET distribute_end_time = NOW() + INTERVAL ${2:-2} SECOND
        WHERE id = $1" >/dev/null
    http POST /market/admin/coupon/preheat '' "$(mint_jwt 1 admin)"
}

# end_ms ID: activity ID's distribute_end_time in epoch ms (as MySQL reads it).
end_ms() {
    mysql_q "SELECT ROUND(UNIX_TIMESTAMP(distribute_end_time) * 1000) FROM activity WHERE id = $1"
}

# --- load -----------------------------------------------------------------------

LOADGEN=$top_builddir/tests/bench/loadgen

# --- Redis keys -------------------------------------------------------------------
#
# key NAME ID: sets KEY to the Redis key NAME ("stock", "reserve", "queue",
# "seized", ...) of activity ID, as `couponseize-admin keys ID` spells it
# with the daemons' own builders (lib/keys.c): the tests never spell the
# schema themselves. Asked once per activity and kept (in this shell: a
# $(...) asks again). key_shard NAME SHARD: the same for shard SHARD's key.
declare -gA CS_KEYS=()
CS_ADMIN=$top_builddir/couponseize-admin
key() {
    local n k _f
    if [[ -z ${CS_KEYS[$2.stock]:-} ]]; then
        while read -r n k _f; do CS_KEYS[$2.$n]=$k; done < <("$CS_ADMIN" keys "$2")
    fi
    KEY=${CS_KEYS[$2.$1]:-}
    [[ -n $KEY ]] || { echo "key: no key '$1' for activity $2" >&2; return 1; }
}
key_shard() { key "$1" $(($2 == 0 ? 10 : $2)); }

# stock_of ID: the remaining stock of activity ID in Redis.
stock_of() { key stock "$1" && rcli HGET "$KEY" "$1"; }

# seize_load ID CONC TOTAL USERBASE [loadgen flags...]: TOTAL seizes of
# activity ID by users USERBASE.. over CONC connections through $COUPON_URL;
# prints loadgen's JSON summary.
seize_load() {
    local LOAD_ARGV
    load_argv "$@"
    "${LOAD_ARGV[@]}"
}

# seize_load_bg OUTFILE ID CONC TOTAL USERBASE [loadgen flags...]: seize_load
# in the background, its summary to OUTFILE. LOAD_PID is loadgen itself, so a
# TERM to it stops the load (a function put in the background with & is a
# subshell, and killing that would leave loadgen running).
seize_load_bg() {
    local out=$1
    shift
    load_argv "$@"
    "${LOAD_ARGV[@]}" >"$out" &
    LOAD_PID=$!
}

# stop_bg PID: stops a background process of this test (a no-op once it has
# ended); for cs_defer, so a load left running by an early exit stops too.
stop_bg() { own_child "$1" && kill "$1" 2>/dev/null && wait "$1" 2>/dev/null; return 0; }

# upgrade_bins: BIN, a directory for the builds an in-place upgrade test
# installs (removed at exit; a test that starts a stack defers its removal
# again, since the stack's exit trap replaces this one), with build 1 in
# place and COUPON_STACK_FCGI_CMD running $BIN/coupon-fcgi.
upgrade_bins() {
    BIN=$(mktemp -d "${TMPDIR:-/tmp}/cs-upgrade-bin.XXXXXX") || exit 99
    # shellcheck disable=SC2064 # BIN is fixed from here on
    trap "rm -rf '$BIN'" EXIT
    upgrade_build 1 || exit 99
    export COUPON_STACK_FCGI_CMD="exec '$BIN/coupon-fcgi' -c \"\$COUPON_CONF\""
}
# upgrade_build N: build N as a package or make leaves a new build, a new
# file at $BIN/coupon-fcgi (the build tree's binary with bytes appended),
# and a copy at $BIN/build-N to compare /proc/PID/exe with.
upgrade_build() {
    cp "$top_builddir/coupon-fcgi" "$BIN/next" &&
        printf '\n%s build %s\n' "$(basename "$0")" "$1" >>"$BIN/next" &&
        cp "$BIN/next" "$BIN/build-$1" && chmod 0755 "$BIN/next" && mv -f "$BIN/next" "$BIN/coupon-fcgi"
}

# load_argv ID CONC TOTAL USERBASE [loadgen flags...]: seize_load's loadgen
# command line, into LOAD_ARGV.
load_argv() {
    local id=$1 conc=$2 total=$3 base=$4
    shift 4
    LOAD_ARGV=("$LOADGEN" -p "${COUPON_URL##*:}" -s "$COUPON_JWT_SECRET" -a "$id" -c "$conc"
        -n "$total" -b "$base" -j "$@")
}

# seize_judge NAME ACTIVITY LOG [FIRST_USER [END_USER]]: checks the answers in
# LOG (a loadgen -L log: one line per answer) against the coupon rows of
# ACTIVITY (of users FIRST_USER up to, not including, END_USER), per user: told SEIZED => holds a
# coupon; holds one => was told SEIZED or UNKNOWN_OUTCOME (the nemesis'
# judge, tests/nemesis/checker.py judge_log()). Sets the counts
# SEIZED UNKNOWN UNAVAILABLE SOLD (SOLD_OUT), the latencies P99_MS and MAX_MS,
# N (answers) and BAD_SEIZED / BAD_HOLDERS.
seize_judge() {
    read -r SEIZED UNKNOWN UNAVAILABLE SOLD P99_MS MAX_MS BAD_SEIZED BAD_HOLDERS N < <(
        mysql_q "SELECT user_id FROM coupon WHERE activity_id = $2 AND user_id >= ${4:-0}
            AND user_id < ${5:-18446744073709551615}" |
            python3 "$top_srcdir/tests/nemesis/checker.py" loadgen "$3" seized unknown \
                unavailable sold_out p99_ms max_ms bad_seized bad_holders answers)
    diag "$1: $N answers: $SEIZED SEIZED, $UNKNOWN UNKNOWN_OUTCOME, $UNAVAILABLE UNAVAILABLE," \
        "$SOLD SOLD_OUT;" \
        "p99 $P99_MS ms, max $MAX_MS ms"
    check_eq "$1: every user told SEIZED holds a coupon in MySQL" 0 "$BAD_SEIZED"
    check_eq "$1: every holder was told SEIZED or UNKNOWN_OUTCOME" 0 "$BAD_HOLDERS"
}

# seize_judge_all NAME ACTIVITY LOG: as seize_judge, for a load whose users
# each seize once (every user of LOG is new) and whose workers may be killed:
# told SEIZED => holds a coupon; holds one => was told SEIZED or
# UNKNOWN_OUTCOME, or got no answer at all (a 5xx without a code, a dropped
# connection); nobody told ALREADY_SEIZED; nobody holds two. Sets SEIZED
# UNKNOWN UNAVAILABLE NOANSWER N.
seize_judge_all() {
    read -r SEIZED UNKNOWN UNAVAILABLE NOANSWER ALREADY BAD_SEIZED BAD_HOLDERS N < <(
        mysql_q "SELECT user_id FROM coupon WHERE activity_id = $2" |
            python3 "$top_srcdir/tests/nemesis/checker.py" loadgen "$3" --kills seized unknown \
                unavailable no_answer already bad_seized bad_holders users)
    diag "$1: $N users: $SEIZED SEIZED, $UNKNOWN UNKNOWN_OUTCOME, $UNAVAILABLE UNAVAILABLE," \
        "$NOANSWER without an answer"
    check_eq "$1: every user told SEIZED holds a coupon in MySQL" 0 "$BAD_SEIZED"
    check_eq "$1: every holder was told SEIZED or UNKNOWN_OUTCOME (or got no answer)" 0 "$BAD_HOLDERS"
    check_eq "$1: no first-time user told ALREADY_SEIZED" 0 "$ALREADY"
    check_eq "$1: nobody holds two" "" \
        "$(mysql_q "SELECT user_id FROM coupon WHERE activity_id = $2 GROUP BY user_id HAVING COUNT(*) > 1")"
}
# load_until_stopped ID USERBASE LOG: 32 connections of fresh users
# (USERBASE, USERBASE + 1, ...) seizing activity ID through $COUPON_URL for
# up to 300 s, each answer logged to LOG, the summary to LOG.json; sets
# LOAD_PID (stopped at exit too) and returns once 200 answers are in (1 when
# they were not, within 30 s x CS_TIME_SCALE).
load_until_stopped() {
    local lu_log=$3
    "$LOADGEN" -p "${COUPON_URL##*:}" -s "$COUPON_JWT_SECRET" -a "$1" -c 32 -D 300 \
        -n 100000000 -b "$2" -L "$lu_log" -j >"$lu_log.json" &
    LOAD_PID=$!
    cs_defer stop_bg "$LOAD_PID"
    # shellcheck disable=SC2016 # expanded by wait_for's eval, in this scope
    wait_for 30 eval '(($(answers "$lu_log") >= 200))'
}
# code_count JSON CODE: how many answers of a seize_load summary had CODE.
code_count() {
    local v
    v=$(json_get "$(json_get "$1" codes)" "$2")
    echo "${v:-0}"
}

# --- node reserves ---------------------------------------------------------------

# metric NAME [NODE]: an unlabelled metric of node 1 (through the web server,
# as an admin) or of node NODE (node_up); a test may define its own.
metric() {
    if [[ -n ${2:-} ]]; then node_http "$2" GET /market/admin/metrics; else
        http GET /market/admin/metrics '' "$(mint_jwt 1 admin)"; fi
    sed -n "s/^$1 \([0-9.e+-]*\)\$/\1/p" <<<"$HTTP_BODY"
}
# seizes_over S [NODE]: how many seizes node 1 (or node NODE) answered in
# more than S seconds (a bound of its histogram; 1 is fallback.budget_ms'
# default), by its own clock from when the request reached it: the budget
# is the server's promise, and a client's process starts on a loaded
# machine are not in it. Counts since the node started.
seizes_over() {
    if [[ -n ${2:-} ]]; then node_http "$2" GET /market/admin/metrics; else
        http GET /market/admin/metrics '' "$(mint_jwt 1 admin)"; fi
    awk -v b="couponseize_seize_duration_seconds_bucket{le=\"$1\"}" '
        $1 == b { le = $2; got++ } $1 == "couponseize_seize_duration_seconds_count" { n = $2; got++ }
        END { if (got == 2) print n - le; else print "no histogram" }' <<<"$HTTP_BODY"
}
# metric_is NAME VALUE [NODE]: for wait_for.
metric_is() { [[ $(metric "$1" "${3:-}") == "$2" ]]; }
# held_of ID: what every node's open reserves of activity ID hold, in Redis.
held_of() { local v; key reserve "$1" && v=$(rcli HGET "$KEY" "$1:held"); echo "${v:-0}"; }
# reserved ID N: the nodes hold N or more of activity ID (for wait_for).
reserved() { (($(held_of "$1") >= $2)); }
# rows_of ID: coupons of activity ID in MySQL, in any status.
rows_of() { mysql_q "SELECT COUNT(*) FROM coupon WHERE activity_id = $1"; }
# drained SHARD: the shard's sync queue is empty (for wait_for).
drained() { key_shard queue "$1" && [[ $(rcli HLEN "$KEY") == 0 ]]; }
# node_health_says NODE SOURCE: node NODE's health names SOURCE ("redis",
# "reserve", "none") as where a seize is granted from now.
node_health_says() {
    node_http "$1" GET /market/health
    [[ "$(json_get "$HTTP_BODY" seize 2>/dev/null)" == "$2" ]]
}
# seize_settled ID TOKEN [NODE]: a seize of activity ID through the web server
# (or straight to node NODE), asked again while it answers UNKNOWN_OUTCOME (a
# worker whose connection died with Redis answers its first seize so: it was
# written), at most 6 times; sets HTTP_CODE, HTTP_BODY and SEIZE_CODE.
seize_settled() {
    local i
    for i in 1 2 3 4 5 6; do
        if [[ -n ${3:-} ]]; then
            node_http "$3" POST /market/consumer/coupon/seize "{\"id\":$1}" "$2"
        else
            http POST /market/consumer/coupon/seize "{\"id\":$1}" "$2"
        fi
        SEIZE_CODE=$(json_get "$HTTP_BODY" code)
        [[ $SEIZE_CODE != UNKNOWN_OUTCOME ]] && return 0
    done
    return 0
}
# field_of ID NODE: what node NODE's open reserve of activity ID holds in
# Redis (NODE: the directory node_up made, e.g. n2); field_is ID NODE N.
field_of() {
    key reserve "$1" && rcli HGET "$KEY" "$1:$(cat "$COUPON_DIR/$2/journal/incarnation")"
}
field_is() { [[ $(field_of "$1" "$2") == "$3" ]]; }
# sale_reserved TAG NODE ID K: a sale ID of 1,000 open for an hour, preheated;
# checks that node NODE (e.g. n4) set aside its reserve of K and opened it.
sale_reserved() {
    mk_activity "$3" 1000 -60 3600
    http POST /market/admin/coupon/preheat '' "$(mint_jwt 1 admin)"
    check "${1:+$1 }node ${2#n} set aside its reserve" wait_for 20 field_is "$3" "$2" "$4"
    check "${1:+$1 }... and opened it" wait_for 20 reserves_open_on "$2"
}
# lease_left_ms NODE MS: node NODE could still grant from an open reserve
# for MS ms at least were Redis gone now: its lease, which runs from the
# claims and renewals the durability rule confirmed, has that much left. For
# wait_for, before a test takes Redis away to see a reserve spent.
lease_left_ms() {
    awk -v v="$(metric couponseize_reserve_lease_left_seconds "$1")" -v ms="$2" \
        'BEGIN { exit !(v != "" && v * 1000 >= ms) }'
}
# copy_grants_three TAG NODE ID KEY OWNER K LOG: node NODE, on a copy of
# another node's journal directory, takes the incarnation's claim KEY over
# from the value OWNER, opens its reserve of activity ID, grants three users
# during a Redis outage (appended to LOG, "user code") and replays them;
# Redis' field is then K - 3. Checks each step under TAG.
copy_grants_three() {
    local tag=$1 node=$2 id=$3 key=$4 owner=$5 k=$6 log=$7 u
    claim_taken() { local v; v=$(rcli GET "$key"); [[ -n $v && $v != "$owner" ]]; }
    check "$tag node ${node#n}, on a copy, takes the incarnation over" wait_for 30 claim_taken
    check "$tag ... and opens the reserve" wait_for 20 reserves_open_on "$node"
    check "$tag ... within a lease" wait_for 20 lease_left_ms "$node" 1000
    stack stop-redis --kill
    check "$tag node ${node#n} seizes from the reserve while Redis is down" \
        wait_for 5 node_health_says "$node" reserve
    for u in 1 2 3; do seize_on "$node" "$id" $((id * 1000 + u)) "$log"; done
    check_eq "$tag node ${node#n} told three users SEIZED" 3 "$(grep -c ' SEIZED$' "$log")"
    stack start-redis
    check "$tag node ${node#n} replayed its journal" \
        wait_for 20 metric_is couponseize_journal_depth 0 "$node"
    check_eq "$tag Redis' field holds what is left: $((k - 3))" $((k - 3)) "$(field_of "$id" "$node")"
}
# seize_on NODE ID USER LOG: one settled seize straight to node NODE; appends
# "user code" to LOG.
seize_on() {
    seize_settled "$2" "$(mint_jwt "$3")" "$1"
    echo "$3 ${SEIZE_CODE:-NO_ANSWER}" >>"$4"
}
# coupons_of ID USER: the coupon rows of USER for activity ID.
coupons_of() { mysql_q "SELECT COUNT(*) FROM coupon WHERE activity_id = $1 AND user_id = $2"; }
# users_misjudged ID TAG LOG...: judges each "user code" line of the LOGs
# against MySQL (told SEIZED: exactly one coupon of activity ID; told
# UNKNOWN_OUTCOME: none or one; told anything else: none), shows each user
# who does not hold what they were told, and prints how many (checker.py
# misjudged: one query, judged by the checker).
users_misjudged() {
    local id=$1 tag=$2
    shift 2
    mysql_q "SELECT user_id FROM coupon WHERE activity_id = $id" |
        checker misjudged "$tag" "$@"
}

# A TCP proxy to the stack's Redis, that a test kills and starts again to cut
# one node off from Redis while the others keep it: proxy_conf FILE writes
# the stack's configuration with redis.port (only) pointing at the proxy
# (PROXY_PORT); proxy_up starts the proxy and waits until it listens;
# proxy_kill kills it (every connection through it drops at once). The exit
# kills it too.
PROXY_PID=""
# free_port: prints a loopback port nothing listens on now (the kernel's pick).
free_port() { testkit free-port; }
proxy_conf() {
    if [[ -z ${PROXY_PORT:-} ]]; then
        PROXY_PORT=$(free_port)
        cs_defer proxy_kill
    fi
    awk -v port="$PROXY_PORT" '/^redis = \{/ { r = 1 } r && /^ *port = / { sub(/=.*/, "= " port ";") }
        /^\};/ { r = 0 } { print }' "$COUPON_CONF" >"$1"
}
proxy_open() { (exec 3<>"/dev/tcp/127.0.0.1/$PROXY_PORT") 2>/dev/null; }
proxy_up() {
    python3 "$CS_TESTKIT" redis-proxy "$PROXY_PORT" "$REDIS_PORT" 2>/dev/null &
    PROXY_PID=$!
    wait_for 10 proxy_open
}
proxy_kill() {
    [[ -z $PROXY_PID ]] || { own_child "$PROXY_PID" && kill -KILL "$PROXY_PID" 2>/dev/null
        wait "$PROXY_PID" 2>/dev/null; PROXY_PID=""; }
}

# reserves_open_on [NODE]: every reserve that node NODE (none: the stack's
# own) has in Redis is spendable on it: its keeper opened each set-aside
# (a pass after the script), so a Redis that goes away now finds them open.
# Holds only while nothing granted is unreplayed (then Redis and the node
# count the same tokens); for wait_for.
reserves_open_on() {
    local node=${1:-} inc f v sum=0 i
    inc=$(cat "$COUPON_DIR${node:+/$node}/journal/incarnation") || return 1
    for ((i = 0; i < 10; i++)); do
        key_shard reserve $i || return 1
        while read -r f v; do
            [[ $f == *":$inc" && $f != lease:* ]] && sum=$((sum + v))
        done < <(rcli HGETALL "$KEY" | paste - -)
    done
    ((sum > 0)) && [[ $(metric couponseize_reserve_held "$node") == "$sum" ]]
}
# balanced ID TOTAL: Redis stock + what reserves hold (read in one script, so
# a set-aside between two reads cannot skew them) + coupons in MySQL = TOTAL.
balanced() {
    local s h r ks
    key stock "$1" && ks=$KEY && key reserve "$1" || return 1
    read -r s h < <(rcli EVAL "return {redis.call('HGET', KEYS[1], ARGV[1]) or '0',
        redis.call('HGET', KEYS[2], ARGV[1] .. ':held') or '0'}" 2 \
        "$ks" "$KEY" "$1" | tr '\n' ' ')
    r=$(rows_of "$1")
    diag "activity $1: stock $s + held $h + coupons $r (total $2)"
    ((s + h + r == $2))
}

# --- queues ---------------------------------------------------------------------

# mk_activities BASE TOTAL: activities BASE..BASE+9 (BASE % 10 == 0: one per
# shard), on sale now, TOTAL coupons each, with their window and stock fields
# in Redis as preheat would set them.
mk_activities() {
    local i now
    now=$(date +%s%3N)
    for ((i = 0; i < 10; i++)); do
        mk_activity $(($1 + i)) "$2" -60 86400 || return 1
        key window $(($1 + i)) || return 1
        rcli hset "$KEY" $(($1 + i)) "$((now - 60000)),$((now + 86400000))" >/dev/null
        key stock $(($1 + i)) || return 1
        rcli hsetnx "$KEY" $(($1 + i)) "$2" >/dev/null
    done
}

# fill_queue BASE USERS UID0: queues users UID0+1..UID0+USERS for each of the
# activities BASE..BASE+9, as lua/seize.lua would (queue entry + stock
# decrement), in redis-cli pipe mode.
fill_queue() {
    local now i qk=() sk=()
    now=$(date +%s%3N)
    for ((i = 0; i < 10; i++)); do
        key queue $(($1 + i)) && qk+=("$KEY") && key stock $(($1 + i)) && sk+=("$KEY") || return 1
    done
    awk -v base="$1" -v per="$2" -v uid0="$3" -v now="$now" -v qk="${qk[*]}" -v sk="${sk[*]}" '
    function bulk(s) { printf "$%d\r\n%s\r\n", length(s), s }
    BEGIN {
        split(qk, Q, " "); split(sk, S, " ")
        for (s = 0; s < 10; s++) {
            a = base + s; key = Q[s + 1]
            for (u = 1; u <= per; u += 1000) {
                m = (per - u + 1 < 1000) ? per - u + 1 : 1000
                printf "*%d\r\n", 2 + 2 * m; bulk("HSET"); bulk(key)
                for (k = 0; k < m; k++) { bulk(a ":" (uid0 + u + k)); bulk(now) }
            }
            printf "*4\r\n"; bulk("HINCRBY"); bulk(S[s + 1])
            bulk(a); bulk(-per)
        }
    }' | rcli --pipe >/dev/null
}

# --- Redis Cluster stacks (cs_stack_up --redis-cluster) --------------------------

# The six nodes as host:port, in REDIS_NODES' order (redisN is NODES[N-1]).
cluster_nodes() { ((${#NODES[@]} > 0)) || read -ra NODES <<<"${REDIS_NODES//,/ }"; }
NODES=()
# addr_of PORT: the node's own address (each node listens on 127.0.1.N).
addr_of() {
    local a
    cluster_nodes
    for a in "${NODES[@]}"; do [[ ${a##*:} == "$1" ]] && { echo "${a%:*}"; return 0; }; done
    return 1
}
# ncli PORT ARGS...: redis-cli against that one node.
ncli() { timeout 10 redis-cli -h "$(addr_of "$1")" -p "$1" "${@:2}"; }
# any_port: a node that is up, skipping DOWN_PORT (a node the test killed).
any_port() {
    local a
    cluster_nodes
    for a in "${NODES[@]}"; do
        [[ ${a##*:} == "${DOWN_PORT:-}" ]] && continue
        [[ $(ncli "${a##*:}" ping 2>/dev/null) == PONG ]] && { echo "${a##*:}"; return 0; }
    done
    return 1
}
# ccli ARGS...: redis-cli -c through any live node.
ccli() { local p; p=$(any_port) && timeout 10 redis-cli -c -h "$(addr_of "$p")" -p "$p" "$@"; }
# slot_owner SLOT: the port of the master serving SLOT, as a live node sees it.
slot_owner() {
    ncli "$(any_port)" cluster nodes | awk -v s="$1" '
        $3 ~ /master/ && $3 !~ /fail/ {
            for (i = 9; i <= NF; i++) {
                if ($i ~ /^\[/) continue
                n = split($i, r, "-"); lo = r[1]; hi = (n == 2 ? r[2] : r[1])
                if (s + 0 >= lo + 0 && s + 0 <= hi + 0) {
                    split($2, a, "@"); m = split(a[1], b, ":"); print b[m]; exit
                }
            }
        }'
}
# node_index PORT: N of the stack's redisN for the node on PORT.
node_index() {
    local i
    cluster_nodes
    for i in "${!NODES[@]}"; do [[ ${NODES[$i]##*:} == "$1" ]] && { echo $((i + 1)); return 0; }; done
    return 1
}

# --- partitions between Redis Cluster nodes (nftables) ----------------------------

# The test's own nftables table: rules of parallel tests never mix.
CS_NFT_TABLE=cs_test_$$

# net_skip_unless_nft: skips the test (77) unless nftables rules can be
# added; then removes the tables of tests and nemesis runs whose process is
# gone (killed by SIGKILL, no exit path ran), so their drops cannot cut
# this test's nodes.
net_skip_unless_nft() {
    local t pid
    command -v nft >/dev/null 2>&1 || skip_all "nft is not installed (Debian nftables)"
    nft list tables >/dev/null 2>&1 || skip_all "nft cannot read the ruleset (needs CAP_NET_ADMIN)"
    for t in $(nft list tables 2>/dev/null | sed -nE 's/^table inet (cs_(test|nemesis)_[0-9]+)$/\1/p'); do
        pid=${t##*_}
        kill -0 "$pid" 2>/dev/null && continue
        nft delete table inet "$t" 2>/dev/null && diag "removed $t, left by process $pid, which is gone"
    done
}

# nemesis_skip_unless_ready: skips a test of tests/nemesis/ (77) unless what a
# run needs is there (python3, nftables, redis-server, a built coupon-fcgi);
# sets NEM to that directory.
nemesis_skip_unless_ready() {
    command -v python3 >/dev/null 2>&1 || skip_all "python3 is not installed"
    net_skip_unless_nft
    command -v redis-server >/dev/null 2>&1 || skip_all "redis-server is not installed"
    [[ -x $top_builddir/coupon-fcgi ]] || skip_all "coupon-fcgi is not built"
    NEM=$top_srcdir/tests/nemesis
}

# nemesis_run OUT ERR ARGS...: one tests/nemesis/run ARGS..., its stdout in
# OUT and stderr in ERR. Its pid joins NEM_PIDS: the run's nftables table is
# cs_nemesis_PID, told apart from that of a run another test makes beside it
# (make -j2 check).
NEM_PIDS=""
nemesis_run() {
    local out=$1 err=$2 p
    shift 2
    "$NEM/run" "$@" >"$out" 2>"$err" &
    p=$!
    NEM_PIDS+=" $p"
    wait "$p"
}

# nemesis_tables_gone: no nftables table of this test's runs is left.
nemesis_tables_gone() {
    local p
    [[ -n $NEM_PIDS ]] || return 1
    for p in $NEM_PIDS; do
        nft list table inet "cs_nemesis_$p" >/dev/null 2>&1 && return 1
    done
    return 0
}

# net_cut "ADDR:PORT ..." "ADDR:PORT ...": drops every TCP packet between the
# nodes of the first group and those of the second, both ways, on their
# client ports and cluster bus ports (port + 10000), so connections opened
# either way hang as on a cut cable. Clients connecting from 127.0.0.1 still
# reach every node. Rules live in the table $CS_NFT_TABLE, which net_heal and
# the test's exit remove.
net_cut() {
    local a=() b=() ports=() x
    for x in $1; do a+=("${x%:*}"); ports+=("${x##*:}" $((${x##*:} + 10000))); done
    for x in $2; do b+=("${x%:*}"); ports+=("${x##*:}" $((${x##*:} + 10000))); done
    local sa sb sp
    sa=$(IFS=,; echo "${a[*]}")
    sb=$(IFS=,; echo "${b[*]}")
    sp=$(IFS=,; echo "${ports[*]}")
    if ! nft list table inet "$CS_NFT_TABLE" >/dev/null 2>&1; then
        # Registered before the table exists: an exit at any point after
        # this removes it (net_heal is a no-op while there is none).
        cs_defer net_heal
        nft add table inet "$CS_NFT_TABLE" || return 1
        nft add chain inet "$CS_NFT_TABLE" input \
            '{ type filter hook input priority -10; policy accept; }' || return 1
    fi
    local from to dir
    for dir in sport dport; do
        for from in "$sa" "$sb"; do
            to=$sb
            [[ $from == "$sb" ]] && to=$sa
            nft add rule inet "$CS_NFT_TABLE" input ip saddr "{ $from }" ip daddr "{ $to }" \
                tcp "$dir" "{ $sp }" drop || return 1
        done
    done
}

# net_heal: removes every rule this test added (a no-op when there is none).
net_heal() {
    nft list table inet "$CS_NFT_TABLE" >/dev/null 2>&1 || return 0
    nft delete table inet "$CS_NFT_TABLE"
}
