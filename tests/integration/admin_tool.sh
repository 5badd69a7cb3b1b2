#!/usr/bin/env bash
# admin_tool.sh - couponseize-admin (admin/, couponseize-admin(8)) against a
# real stack: two coupon-fcgi nodes with reserves, nginx, Redis, MariaDB.
# Every verb runs the way a sysadmin runs it: the token minted from the
# stack's configuration, the request on the FastCGI socket that fcgi.listen
# names (the default) or through nginx (--url http://...). Checked: what
# each verb changes (MySQL, Redis, the API's own answers), its human output,
# its --json output parsed, and its exit status by outcome: 0 done, 2 usage,
# 3 not found, 4 conflict, 5 invalid, 6 token refused, 7 unavailable, 8 no
# answer, 9 configuration unreadable, 10 database newer, 11 database error.
# migrate runs on a database of its own: every file in order, nothing the
# second time, a newer database refused.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/lib.sh"

TOOL=$top_builddir/couponseize-admin
[[ -x $TOOL ]] || skip_all "couponseize-admin is not built"
skip_unless_cmd cgi-fcgi || skip_all "cgi-fcgi is not installed"
K=20
LEASE=3000
export COUPON_WORKERS=2
export COUPON_CONF_OVERRIDES="fallback.reserve=$K
fallback.lease_ms=$LEASE
${COUPON_CONF_OVERRIDES:-}"
cs_stack_up

# adm ARGS: runs the tool on node 1's configuration; OUT, ERR and RC hold
# what it printed and its exit status.
adm() {
    local e
    e=$(mktemp "$COUPON_DIR/adm-err.XXXXXX")
    OUT=$("$TOOL" -c "$COUPON_CONF" "$@" 2>"$e")
    RC=$?
    ERR=$(cat "$e")
    rm -f "$e"
}
# jq_ PATH: the value at a dotted path of OUT (as jat).
jq_() { jat "$OUT" "$1"; }
at() { date -d "@$(($(date +%s) + $1))" +%Y-%m-%dT%H:%M:%S%:z; }

# --- usage and the configuration ----------------------------------------------------
adm
check_eq "no verb: exit 2" 2 "$RC"
adm frobnicate
check_eq "an unknown verb: exit 2 ($ERR)" 2 "$RC"
adm topup 42
check_eq "topup without K: exit 2" 2 "$RC"
adm revoke 0
check_eq "an id of 0: exit 2 ($ERR)" 2 "$RC"
adm create --name x --total 10
check_eq "create without --start/--end: exit 2 ($ERR)" 2 "$RC"
OUT=$("$TOOL" -c "$COUPON_DIR/missing.conf" status 2>&1)
check_eq "a configuration that is not there: exit 9" "9" "$?"
cp "$COUPON_CONF" "$COUPON_DIR/private.conf"
chmod 0600 "$COUPON_DIR/private.conf"
if [[ $(id -u) == 0 ]] && command -v setpriv >/dev/null; then
    # root reads anything: run as nobody, as a user outside group couponseize would.
    chmod 0711 "$COUPON_DIR"
    err=$(setpriv --reuid=nobody --regid=nogroup --clear-groups \
        "$TOOL" -c "$COUPON_DIR/private.conf" token 2>&1)
    rc=$?
    chmod 0700 "$COUPON_DIR"
else
    chmod 0000 "$COUPON_DIR/private.conf"
    err=$("$TOOL" -c "$COUPON_DIR/private.conf" token 2>&1)
    rc=$?
fi
check_eq "a user who cannot read the configuration mints no token: exit 9" 9 "$rc"
check_match "... and is told why" "only root and the group couponseize" "$err"

# --- bash completion (etc/bash-completion/couponseize-admin) ------------------------------
if [[ -f /usr/share/bash-completion/bash_completion ]]; then
    comp=$(PATH=$top_builddir:$PATH bash -c '
        . /usr/share/bash-completion/bash_completion
        . "$1/etc/bash-completion/couponseize-admin"
        t() {
            COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
            COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; COMPREPLY=()
            _couponseize_admin couponseize-admin "${COMP_WORDS[-1]}" "${COMP_WORDS[-2]}"
            echo "${COMPREPLY[*]}"
        }
        t couponseize-admin -c x.conf re
        t couponseize-admin --js
        t couponseize-admin status ""' _ "$top_srcdir")
    check_eq "bash completion: verbs after an option's value, options from --help" \
        "revoke reconcile reserves return|--json|" "$(tr '\n' '|' <<<"$comp")"
else
    diag "bash completion not checked: bash-completion is not installed"
fi

# --- token -----------------------------------------------------------------------------
adm token
check_match "token prints a JWT" '^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$' "$OUT"
payload=$(testkit jwt-payload --sorted "$OUT")
check_match "... an admin's, expiring in 60 s" '"role": "admin"' "$payload"
tok_exp=$(jat "$payload" exp) tok_iat=$(jat "$payload" iat)
check_eq "... exp - iat = 60" 60 "$((${tok_exp:-0} - ${tok_iat:-0}))"
http GET "/market/admin/coupon/activity?page=1&size=1" '' "$OUT"
check_eq "... that the API takes through nginx" 200 "$HTTP_CODE"
adm token --json --ttl 600 --sub 77
check_eq "token --json --ttl 600: expiresIn" 600 "$(jq_ expiresIn)"

# --- create, status, update, topup --------------------------------------------------
adm create --name "tool sale" --total 100 --start "$(at 3600)" --end "$(at 7200)" \
    --amount 10 --validity-days 7
check_eq "create: exit 0 ($ERR)" 0 "$RC"
check_match "create: says so, for people" "activity created" "$OUT"
A=$(awk '$1 == "id:" {print $2; exit}' <<<"$OUT")
check_match "create: prints the new id ($A)" '^[0-9]+$' "$A"
adm create --json --name "tool sale 2" --total 1000 --start "$(at -60)" --end "$(at 3600)"
check_eq "create --json: code OK" OK "$(jq_ code)"
B=$(jq_ id)
check_eq "create --json: the sale in MySQL" "tool sale 2 1000" \
    "$(mysql_q "SELECT name, total_num FROM activity WHERE id = ${B:-0}" | tr '\t' ' ')"
adm create --name bad --total 10 --start "$(at 7200)" --end "$(at 3600)"
check_eq "create with end before start: 400 -> exit 5" 5 "$RC"
check_match "... the message names the field" "400 BAD_REQUEST.*distributeEndTime" "$ERR"
adm create --json --name bad --total 10 --start "$(at 7200)" --end "$(at 3600)"
check_eq "... with --json the answer on stdout" BAD_REQUEST "$(jq_ code)"

adm status "$A"
check_eq "status ID: exit 0" 0 "$RC"
check_match "status ID: human output" "totalNum: 100" "$OUT"
adm status --json "$A"
check_eq "status --json ID: totalNum" 100 "$(jq_ activity.totalNum)"
adm status --json --size 200
ids=$(testkit json-pluck "$OUT" activities id)
check "status --json (a page) lists both ($ids)" \
    eval '[[ " $ids " == *" $A "* && " $ids " == *" $B "* ]]'
adm status
check_match "status (a page) for people: a table with a header" "idStr +status +totalNum" "$OUT"
adm status 999999999
check_eq "status of an unknown sale: 404 -> exit 3" 3 "$RC"

adm update "$A" --total 150 --name "tool sale, renamed"
check_eq "update before the start: exit 0 ($ERR)" 0 "$RC"
check_eq "... MySQL has it" "tool sale, renamed 150" \
    "$(mysql_q "SELECT name, total_num FROM activity WHERE id = $A" | tr '\t' ' ')"
adm update "$A"
check_eq "update with nothing to change: exit 2" 2 "$RC"
adm update "$B" --total 5
check_eq "update of a started sale's total: 400 -> exit 5" 5 "$RC"

adm topup --json "$B" 50
check_eq "topup --json: 200 OK" OK "$(jq_ code)"
check_eq "... totalNum 1050 in MySQL" 1050 "$(mysql_q "SELECT total_num FROM activity WHERE id = $B")"
adm topup --idempotency-key "tool-topup-1" "$B" 7
adm topup --idempotency-key "tool-topup-1" "$B" 7
check_eq "a topup repeated with its key: exit 0" 0 "$RC"
check_eq "... counts once (1057)" 1057 "$(mysql_q "SELECT total_num FROM activity WHERE id = $B")"
adm topup --idempotency-key "tool-topup-1" "$B" 8
check_eq "the key with another topup: 422 -> exit 5" 5 "$RC"

# --- preheat, reserves, return ----------------------------------------------------------
adm preheat
check_eq "preheat: exit 0 ($ERR)" 0 "$RC"
check_match "preheat: what it loaded, for people" "loaded: [0-9]+" "$OUT"

# --- keys: where a sale lives in Redis, spelt as the daemons spell it -----------------------
adm keys "$B"
check_eq "keys ID: exit 0 ($ERR)" 0 "$RC"
kname() { awk -v n="$1" '$1 == n { print $2 }' <<<"$OUT"; }
check_eq "keys: the stock key holds the preheated sale's stock field" 1 \
    "$(rcli HEXISTS "$(kname stock)" "$B")"
check_eq "... the window and meta keys hold its fields" "1 1" \
    "$(rcli HEXISTS "$(kname window)" "$B") $(rcli HEXISTS "$(kname meta)" "$B")"
http POST /market/consumer/coupon/seize "{\"id\":$B}" "$(mint_jwt 77001)"
check_eq "... a user seizes: SEIZED" SEIZED "$(json_get "$HTTP_BODY" code)"
check_eq "... the seize list key holds that user" 1 "$(rcli HEXISTS "$(kname seized)" 77001)"
STOCK_KEY=$(kname stock)
adm --json keys "$B"
check_eq "keys --json: the same stock key, the sale's shard" "$STOCK_KEY $((B % 10))" \
    "$(jq_ keys.stock.key) $(jq_ shard)"
"$TOOL" -c /nonexistent/couponseize.conf keys "$B" >/dev/null 2>&1
check_eq "keys needs no configuration" 0 "$?"
adm keys 0
check_eq "keys 0: exit 2" 2 "$RC"

node_up n2 || finish
INC1=$(cat "$COUPON_DIR/journal/incarnation")
INC2=$(cat "$COUPON_DIR/n2/journal/incarnation")
check "both nodes set a reserve of sale $B aside" wait_for 20 reserved "$B" $((2 * K))
inc_listed() {
    adm reserves --json "$B"
    [[ $(testkit json-find "$OUT" reserves incarnation "$1" leaseExpired) == "$2" ]]
}
check "reserves --json lists both incarnations, leases live" wait_for 10 \
    eval 'inc_listed "$INC1" false && inc_listed "$INC2" false'
adm reserves "$B"
check_match "reserves for people: a table of incarnations" "$INC1" "$OUT"
adm return "$B" "$INC1"
check_eq "return of a live node's reserve: 409 LEASE_NOT_EXPIRED -> exit 4" 4 "$RC"
check_match "... said on stderr" "409 LEASE_NOT_EXPIRED" "$ERR"
adm return "$B" 0123456789abcdef0123456789abcdef
check_eq "return of an incarnation with nothing open: 404 -> exit 3" 3 "$RC"
adm return "$B" not-an-incarnation
check_eq "return of a malformed incarnation: 400 -> exit 5" 5 "$RC"
node_down n2 KILL
check "n2 killed: its lease runs out" wait_for 15 inc_listed "$INC2" true
adm return --json --sub 4242 "$B" "$INC2"
check_eq "return of the lost node's reserve: exit 0 ($ERR)" 0 "$RC"
check_eq "... what it held stays out of stock until it replays" "OK $K" \
    "$(jq_ code) $(jq_ parked)"
check_eq "... its epoch closed by 'admin' in MySQL" "2 admin" \
    "$(mysql_q "SELECT state, closed_by FROM reserve_epoch WHERE activity_id = $B
                AND incarnation = '$INC2'" | tr '\t' ' ')"
check_eq "... admin_audit records it as the --sub admin's" "4242 OK" \
    "$(mysql_q "SELECT admin_sub, result FROM admin_audit WHERE action = 'reserve_return'
                ORDER BY id DESC LIMIT 1" | tr '\t' ' ')"

# --- through nginx, and a token the node does not take ---------------------------------
adm --url "$COUPON_URL" status --json "$B"
check_eq "--url http://... (through nginx and its ACL): status" "0 1057" "$RC $(jq_ activity.totalNum)"
sed "s|^\( *jwt_secret = \).*|\1\"$(printf 'x%.0s' {1..40})\";|" "$COUPON_CONF" \
    >"$COUPON_DIR/otherkey.conf"
OUT=$("$TOOL" -c "$COUPON_DIR/otherkey.conf" --url "$COUPON_URL" status "$B" 2>&1)
check_eq "a token signed with another key: 401 -> exit 6" 6 "$?"
adm --url "fcgi:$COUPON_DIR/no-such.sock" status "$B"
check_eq "no coupon-fcgi at the address: exit 8" 8 "$RC"
adm --url "fcgi:$COUPON_DIR/no-such.sock" --json revoke "$B"
check_eq "... --json says NO_ANSWER" "8 NO_ANSWER" "$RC $(jq_ code)"
check "... and a write never sent does not say it may have been done" \
    eval '[[ $ERR != *"may have been done"* ]]'
# A coupon-fcgi that takes the request and dies before it answers: the
# write is sent 3 times with one Idempotency-Key, then said to be unknown.
python3 "$CS_TESTKIT" mute-fcgi "$COUPON_DIR/mute.sock" "$COUPON_DIR/mute.log" &
MUTE_PID=$!
cs_defer stop_bg "$MUTE_PID"
check "a mute FastCGI server listens" wait_for 10 test -S "$COUPON_DIR/mute.sock"
adm --url "fcgi:$COUPON_DIR/mute.sock" topup "$B" 3
check_eq "a topup whose answer never comes: exit 8" 8 "$RC"
check_match "... and it may have been done" "may have been done" "$ERR"
check_eq "... sent 3 times with one key" "3 1" \
    "$(wc -l <"$COUPON_DIR/mute.log") $(sort -u "$COUPON_DIR/mute.log" | grep -c '^[0-9a-f]\{32\}$')"
adm --url "fcgi:$COUPON_DIR/mute.sock" status "$B"
check_eq "a read is sent once" "8 4" "$RC $(wc -l <"$COUPON_DIR/mute.log")"
adm --url https://127.0.0.1/ status
check_eq "https:// is refused: exit 2" 2 "$RC"

# --- revoke, reconcile --------------------------------------------------------------------
adm reconcile "$A"
check_eq "reconcile: exit 0 ($ERR)" 0 "$RC"
adm revoke "$A"
check_eq "revoke: exit 0 ($ERR)" 0 "$RC"
check_eq "... status 4 in MySQL" 4 "$(mysql_q "SELECT status FROM activity WHERE id = $A")"
adm topup "$A" 5
check_eq "topup of a revoked sale: 409 VOIDED -> exit 4" "4" "$RC"
check_match "... said on stderr" "409 VOIDED" "$ERR"

# --- migrate ---------------------------------------------------------------------------------
root_q() { mariadb --no-defaults --socket="$MYSQL_SOCKET" -uroot -N -B "$@"; }
nfiles=$(find "$top_srcdir/sql" -name '[0-9][0-9][0-9]_*.sql' | wc -l)
MIG=(--db-user root --db-socket "$MYSQL_SOCKET" --sql-dir "$top_srcdir/sql")
root_q -e "CREATE DATABASE cs_migrate CHARACTER SET utf8mb4"
adm migrate "${MIG[@]}" --db-name cs_migrate --dry-run --json
check_eq "migrate --dry-run on an empty database: every file pending, nothing done" \
    "0 $nfiles 0" "$RC $(testkit json-len "$OUT" pending) $(root_q cs_migrate -e 'SHOW TABLES' | wc -l)"
adm migrate "${MIG[@]}" --db-name cs_migrate
check_eq "migrate on an empty database: exit 0 ($ERR)" 0 "$RC"
check_eq "... applied every file, in order" \
    "$(cd "$top_srcdir/sql" && ls [0-9][0-9][0-9]_*.sql | sed 's/\.sql$//' | tr '\n' ' ')" \
    "$(awk '$1 == "applied" {printf "%s ", $2}' <<<"$OUT")"
check_eq "... recorded each in schema_migration" "$nfiles" \
    "$(root_q cs_migrate -e 'SELECT COUNT(*) FROM schema_migration')"
check_eq "... the tables a stack's database has" \
    "$(root_q couponseize -e 'SHOW TABLES' | tr '\n' ' ')" \
    "$(root_q cs_migrate -e 'SHOW TABLES' | tr '\n' ' ')"
adm migrate "${MIG[@]}" --db-name cs_migrate --json
check_eq "migrate again: exit 0, nothing applied" "0 OK []" \
    "$RC $(jq_ code) $(jq_ applied)"
if [[ $(id -un) == root ]]; then
    # As "sudo couponseize-admin migrate" runs it: MariaDB's root, no password,
    # the configuration's server (its socket here) and database.
    adm migrate --sql-dir "$top_srcdir/sql"
    check_eq "migrate with no account given (root, as sudo mariadb) on the stack's database: nothing to do" 0 "$RC"
    check_match "... said for people" "nothing to do" "$OUT"
fi
adm migrate --db-user couponseize --db-password-file <(printf '%s\n' "$MYSQL_PASSWORD") \
    --sql-dir "$top_srcdir/sql"
check_eq "migrate as the app's user (password from a file) on a current database: nothing to do" \
    0 "$RC"
root_q cs_migrate -e "INSERT INTO schema_migration (version) VALUES ('999_from_the_future')"
adm migrate "${MIG[@]}" --db-name cs_migrate --json
check_eq "a database newer than the build: refused, exit 10" "10 SCHEMA_NEWER" "$RC $(jq_ code)"
check_match "... naming the version" "999_from_the_future" "$ERR"
adm migrate "${MIG[@]}" --db-name cs_migrate --sql-dir "$COUPON_DIR"
check_eq "a directory without the migrations: exit 11" 11 "$RC"
adm migrate --db-user nosuchuser --db-socket "$MYSQL_SOCKET" --sql-dir "$top_srcdir/sql"
check_eq "MySQL refusing the account: exit 11" 11 "$RC"
root_q -e "DROP DATABASE cs_migrate"

# --- unavailable ----------------------------------------------------------------------------
stack stop-redis
adm preheat
check_eq "preheat with Redis down: 503 -> exit 7 ($ERR)" 7 "$RC"
finish
