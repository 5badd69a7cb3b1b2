#!/usr/bin/env bash
# deb.sh - the Debian package on this machine: "make deb" builds it and
# lintian passes it, dpkg -i installs it (system user, modes, the conffile as
# shipped and a fresh key in a file of its own, units enabled), the installed
# services run as their units run them (ExecStartPre=, ExecStart=, User=, the
# socket handed over as by coupon-fcgi.socket): without MySQL and Redis they
# keep running and say so, on an older schema they refuse to start, pointed
# at a test stack's they serve a seize; a reinstall and an upgrade that ships
# a changed conffile keep the admin's settings (couponseize.conf.d) and key
# without a question, and a purge leaves nothing behind but a journal that
# holds grants, moved aside. Between the install and the upgrade it walks
# the install path of doc/operations.md as a sysadmin would (the blocks
# fenced ```sh test, run as written), with the system's MariaDB, Redis and
# nginx, to 10,000 users seized on two nodes (see that section).
#
# Installs system-wide, so it needs root and a machine where couponseize is
# not installed (it skips otherwise). Whatever happens, the exit purges the
# package again. Nothing starts through systemd: there may be none running,
# and policy-rc.d refuses service starts while the package is installed.
# shellcheck disable=SC2317,SC2016 # helpers are called through check and cs_defer; eval'd strings
set -u

# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

MAKE=${MAKE:-make}
PKG=couponseize
CONF=/etc/couponseize/couponseize.conf
STATE=/var/lib/couponseize
UNITDIR=/lib/systemd/system
POLICY=/usr/sbin/policy-rc.d

[[ $(id -u) == 0 ]] || skip_all "needs root: dpkg -i installs into the system"
for c in dpkg dpkg-deb dpkg-buildpackage dh setpriv systemd-socket-activate flock; do
    command -v "$c" >/dev/null 2>&1 || skip_all "$c is not installed (./bootstrap installs it)"
done
[[ -f $top_builddir/Makefile ]] || skip_all "$top_builddir is not configured (no Makefile)"
# One package test per machine at a time (another checkout's make check may
# run this test too): the second waits for the first to purge. The lock is
# fd 9 of this shell; the servers it starts get the fd closed (9>&-), so none
# of them can hold the lock past the test.
LOCK=/run/lock
[[ -d $LOCK ]] || LOCK=/tmp
exec 9>"$LOCK/couponseize-deb-test.lock"
flock -w 600 9 || skip_all "another deb.sh has held $LOCK/couponseize-deb-test.lock for 10 minutes"
# Never on a machine that has couponseize for real: the purge at the end
# would take its configuration, journal and user. A package this test
# installed and could not purge (killed before its cleanup: the marker it
# writes before it installs is still there) is its own: purged first, or
# every later run would skip.
MARK=/var/lib/couponseize-deb-test.installed
st=$(dpkg-query -W -f='${db:Status-Status}' "$PKG" 2>/dev/null)
if [[ -n $st && $st != not-installed && -e $MARK ]]; then
    diag "a package an earlier deb.sh installed is still here ($st, since $(stat -c %y "$MARK")): purged first"
    DEBIAN_FRONTEND=noninteractive dpkg --purge --force-all "$PKG" >&2 ||
        skip_all "the package an earlier deb.sh left could not be purged"
    rm -rf /var/lib/couponseize-journal.* /dev/shm/couponseize
    rm -f "$MARK"
    st=$(dpkg-query -W -f='${db:Status-Status}' "$PKG" 2>/dev/null)
fi
if [[ -n $st && $st != not-installed ]]; then
    skip_all "package $PKG is on this machine ($st); not touching it"
fi
if getent passwd "$PKG" >/dev/null || getent group "$PKG" >/dev/null ||
    [[ -e /etc/couponseize || -e $STATE ]]; then
    skip_all "user, group, /etc/couponseize or $STATE of $PKG exist here; not touching them"
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/cs-deb.XXXXXX") || exit 99
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM

# quietly CMD...: runs CMD, showing its output only when it fails.
quietly() {
    local out
    out=$("$@" 2>&1) && return 0
    printf '%s\n' "$out" | tail -n 30 | sed 's/^/# /'
    return 1
}

# dpkg_do ARGS...: dpkg ARGS, waited for while another dpkg or apt holds the
# lock (up to 2 minutes); the output goes to $TMP/dpkg.log.
dpkg_do() {
    local deadline=$((SECONDS + 120)) rc
    while :; do
        DEBIAN_FRONTEND=noninteractive dpkg "$@" >"$TMP/dpkg.log" 2>&1 && return 0
        rc=$?
        if grep -q 'lock' "$TMP/dpkg.log" && ((SECONDS < deadline)); then
            sleep 2
            continue
        fi
        sed 's/^/# /' "$TMP/dpkg.log"
        return "$rc"
    done
}

# --- build ---------------------------------------------------------------------

t=$SECONDS
# One job and no unit tests (make check runs them): the machine is shared
# with the test running beside this one.
if DEB_BUILD_OPTIONS=nocheck "$MAKE" --no-print-directory -C "$top_builddir" deb \
    DEB_OUT="$TMP/out" DEB_WORK="$TMP/work" DEB_JOBS=1 LINTIAN=: >"$TMP/build.log" 2>&1; then
    ok "make deb builds the package from a clean tree"
else
    not_ok "make deb builds the package from a clean tree"
    tail -n 40 "$TMP/build.log" | sed 's/^/# /'
    finish
fi
DEB=$(find "$TMP/out" -name "${PKG}_*.deb" 2>/dev/null | head -n 1)
[[ -f $DEB ]] || { echo "Bail out! no .deb in $TMP/out"; exit 99; }
diag "built ${DEB##*/} ($(stat -c %s "$DEB") bytes) in $((SECONDS - t)) s"

if command -v lintian >/dev/null 2>&1; then
    out=$(lintian --fail-on error,warning "$TMP"/out/${PKG}_*.changes 2>&1)
    rc=$?
    out=$(grep -v 'running with root privileges' <<<"$out")
    if ((rc == 0)) && [[ -z $out ]]; then
        ok "lintian: no error, no warning debian/couponseize.lintian-overrides does not explain"
    else
        not_ok "lintian: no error, no warning debian/couponseize.lintian-overrides does not explain" \
            "$out"
    fi
fi

LIST=$(dpkg-deb -c "$DEB")
has_path() { grep -q " \.$1\$" <<<"$LIST"; }
for f in /usr/sbin/coupon-fcgi /usr/sbin/coupon-sync \
    /usr/share/couponseize/sql/001_schema.sql /usr/share/couponseize/sql/006_reserve.sql \
    "$CONF" "$UNITDIR/coupon-fcgi.socket" "$UNITDIR/coupon-fcgi.service" \
    "$UNITDIR/coupon-sync.service" /usr/lib/tmpfiles.d/couponseize.conf \
    /usr/share/man/man8/coupon-fcgi.8.gz /usr/share/man/man8/coupon-sync.8.gz \
    /usr/share/man/man5/couponseize.conf.5.gz \
    /usr/share/couponseize/examples/nginx/couponseize.conf \
    /usr/share/couponseize/examples/lighttpd/couponseize.conf \
    /usr/share/couponseize/examples/apache2/couponseize.conf; do
    check "package holds $f" has_path "$f"
done
check_match "the configuration is shipped 0640" \
    "^-rw-r----- root/root .* \./etc/couponseize/couponseize\.conf" \
    "$(grep 'etc/couponseize/couponseize.conf' <<<"$LIST")"
check_eq "the conffiles: the configuration and the Redis settings" \
    "/etc/couponseize/couponseize-redis.conf $CONF" \
    "$(dpkg-deb -I "$DEB" conffiles 2>/dev/null | sort | tr '\n' ' ' | sed 's/ $//')"
check "the package holds an empty couponseize.conf.d/" has_path "/etc/couponseize/couponseize.conf.d/"
check_eq "no sysusers.d entry: postinst alone makes the user" "" \
    "$(grep 'sysusers\.d' <<<"$LIST")"
check_eq "no tmpfiles z line resets an admin's owner or mode" "" \
    "$(dpkg-deb --fsys-tarfile "$DEB" | tar -xOf - ./usr/lib/tmpfiles.d/couponseize.conf |
        grep -E '^[zZ][[:space:]]')"
ctl=$(dpkg-deb -f "$DEB" Suggests Recommends)
check_match "mariadb-server and redis-server are suggested" \
    '^Suggests: .*mariadb-server.*redis-server' "$ctl"
check_eq "... and not recommended" "" "$(grep '^Recommends:.*\(mariadb\|redis\)' <<<"$ctl")"
check_eq "debian/copyright: BSD-2-Clause, the whole package" "License: BSD-2-Clause" \
    "$(dpkg-deb --fsys-tarfile "$DEB" | tar -xOf - ./usr/share/doc/couponseize/copyright |
        grep '^License:' | sort -u)"
dpkg-deb -e "$DEB" "$TMP/ctl"
check_eq "postinst edits no conffile (no sed -i, no writes to couponseize.conf)" "" \
    "$(grep -nE 'sed[[:space:]]+(-[a-zA-Z]*i|--in-place)|>>?[[:space:]]*"?\$CONF"?([[:space:]]|$)' \
        "$TMP/ctl/postinst")"
check_eq "nothing enabled in a web server's configuration" "" \
    "$(grep -E '\./etc/(nginx|apache2|lighttpd)/' <<<"$LIST")"

# --- a stack for the installed binaries --------------------------------------------

# Registered before anything is installed, run on every exit: stop the
# installed daemons, purge the package, drop what this test added.
PIDS=()
POLICY_MADE=0
pkg_cleanup() {
    local p
    walk_cleanup
    for p in "${PIDS[@]}"; do stop_bg "$p"; done
    st=$(dpkg-query -W -f='${db:Status-Status}' "$PKG" 2>/dev/null)
    if [[ -n $st && $st != not-installed ]]; then
        dpkg_do --purge --force-all "$PKG" >&2 || echo "# cleanup: dpkg --purge $PKG failed" >&2
    fi
    st=$(dpkg-query -W -f='${db:Status-Status}' "$PKG" 2>/dev/null)
    [[ -n $st && $st != not-installed ]] || rm -f "$MARK"
    rm -f /dev/shm/couponseize
    rm -rf /var/lib/couponseize-journal.*
    ((POLICY_MADE)) && rm -f "$POLICY"
    rm -rf "$TMP"
}

# Redis, MariaDB with the schema, and nginx with the shipped snippet; its own
# coupon-fcgi (from the build tree) makes way for the installed one below.
cs_defer pkg_cleanup
cs_stack_up --no-sync 9>&-

if [[ ! -e $POLICY ]]; then
    printf '#!/bin/sh\n# deb.sh: no service starts while the test package is installed\nexit 101\n' >"$POLICY"
    chmod 755 "$POLICY"
    POLICY_MADE=1
fi
stack stop-fcgi >/dev/null 2>&1 9>&-

# --- install --------------------------------------------------------------------------

T0=$(date +%s%3N)
date >"$MARK"
check "dpkg -i installs the package" dpkg_do -i "$DEB"
T_INST=$(date +%s%3N)
diag "dpkg -i took $((T_INST - T0)) ms"

pw=$(getent passwd "$PKG")
IFS=: read -r _ _ uid gid _ home shell <<<"$pw"
check_match "system user couponseize exists" '^[0-9]+$' "${uid:-}"
check "its uid is a system one (below 1000)" test "${uid:-1000}" -lt 1000
check_eq "its primary group is couponseize" "$PKG" "$(getent group "${gid:-x}" | cut -d: -f1)"
check_eq "its home is $STATE" "$STATE" "${home:-}"
check_match "it has no login shell" '^(/usr/sbin/nologin|/sbin/nologin|/bin/false)$' "${shell:-}"

check_eq "$CONF: 0640 root:couponseize" "640 root $PKG" "$(stat -c '%a %U %G' "$CONF" 2>/dev/null)"
check_eq "$STATE: 0755 couponseize" "755 $PKG $PKG" "$(stat -c '%a %U %G' "$STATE" 2>/dev/null)"
check_eq "$STATE/journal: 0700 couponseize" "700 $PKG $PKG" \
    "$(stat -c '%a %U %G' "$STATE/journal" 2>/dev/null)"
if command -v systemd-tmpfiles >/dev/null 2>&1; then
    check_eq "/run/couponseize (tmpfiles.d): 0750 couponseize:www-data" "750 $PKG www-data" \
        "$(stat -c '%a %U %G' /run/couponseize 2>/dev/null)"
fi
check_match "dpkg lists $CONF as a conffile" "^ $CONF [0-9a-f]{32}\$" \
    "$(dpkg-query -W -f='${Conffiles}\n' "$PKG" | grep " $CONF ")"

KEY=/etc/couponseize/jwt_secret
SECRET=$(cat "$KEY" 2>/dev/null)
check_match "postinst made a random key in $KEY" '^[0-9a-f]{64}$' "$SECRET"
check_eq "$KEY: 0640 root:couponseize" "640 root $PKG" "$(stat -c '%a %U %G' "$KEY" 2>/dev/null)"
check_eq "the configuration names it" "jwt_secret_file = \"$KEY\";" \
    "$(grep -o '^[[:space:]]*jwt_secret_file = .*' "$CONF" | sed 's/^[[:space:]]*//')"
# dpkg --verify: the conffile is as shipped (no "??5" line for it).
check_eq "dpkg --verify: the conffile is untouched by the scripts" "" \
    "$(dpkg --verify "$PKG" 2>&1 | grep -F "$CONF")"
shipped=$(dpkg-query -W -f='${Conffiles}\n' "$PKG" | awk -v c="$CONF" '$1 == c { print $2 }')
check_eq "... its md5sum is the shipped one" "$shipped" "$(md5sum "$CONF" | cut -d' ' -f1)"
check "the units are enabled (sockets.target, multi-user.target)" test \
    -L /etc/systemd/system/sockets.target.wants/coupon-fcgi.socket -a \
    -L /etc/systemd/system/multi-user.target.wants/coupon-fcgi.service -a \
    -L /etc/systemd/system/multi-user.target.wants/coupon-sync.service
if command -v man >/dev/null 2>&1; then
    check_match "man finds coupon-fcgi(8)" '/usr/share/man/man8/coupon-fcgi\.8\.gz$' \
        "$(man -w coupon-fcgi 2>/dev/null)"
fi
left=$(find /etc/nginx/sites-enabled /etc/nginx/conf.d /etc/apache2/conf-enabled \
    /etc/apache2/sites-enabled /etc/lighttpd/conf-enabled -iname '*couponseize*' 2>/dev/null)
check_eq "no web server snippet enabled" "" "$left"

# unit_get UNIT KEY: the value of KEY= in the installed UNIT (the first one).
unit_get() { sed -n "s/^$2=//p" "$UNITDIR/$1" | head -n 1; }
U=$(unit_get coupon-fcgi.service User) G=$(unit_get coupon-fcgi.service Group)
check_eq "the units run as the package's user" "$PKG $PKG" "$U $G"
# as_unit CMD...: CMD as the units' User= and Group=, from /, as systemd runs it.
as_unit() { (cd / && exec setpriv --reuid="$U" --regid="$G" --init-groups -- "$@"); }

for u in coupon-fcgi.service coupon-sync.service; do
    check_eq "$u: Restart=on-failure, but gives up after 5 failed starts in 60 s" \
        "on-failure 60s 5" \
        "$(unit_get "$u" Restart) $(unit_get "$u" StartLimitIntervalSec) $(unit_get "$u" StartLimitBurst)"
done
read -ra pre <<<"$(unit_get coupon-fcgi.service ExecStartPre)"
check_eq "ExecStartPre= is coupon-fcgi -t on the conffile" \
    "/usr/sbin/coupon-fcgi -t -c $CONF" "${pre[*]}"
check "coupon-fcgi -t accepts the installed configuration (as the unit's user)" \
    quietly as_unit "${pre[@]}"
read -ra pre <<<"$(unit_get coupon-sync.service ExecStartPre)"
check "coupon-sync -t accepts the installed configuration (as the unit's user)" \
    quietly as_unit "${pre[@]}"

# systemd-analyze verify reads the installed units where systemd would; it
# exits 0 on unknown keys and bad values, so any line naming our units fails.
out=$(systemd-analyze verify --man=no "$UNITDIR/coupon-fcgi.socket" \
    "$UNITDIR/coupon-fcgi.service" "$UNITDIR/coupon-sync.service" 2>&1)
rc=$?
ours=$(grep -E 'coupon-(fcgi|sync)\.' <<<"$out")
if [[ -n $ours ]]; then
    not_ok "systemd-analyze verify: the installed units are clean" "$ours"
elif ((rc != 0)); then
    ok "systemd-analyze verify # SKIP cannot run here: $(head -n 1 <<<"$out")"
else
    ok "systemd-analyze verify: the installed units are clean"
fi

# --- run as the units do -------------------------------------------------------------

# conf_set KEY=VALUE...: the admin's settings ("group.key"s), as the docs
# say: in couponseize.conf.d/local.conf (0640 root:couponseize), merged
# with what earlier calls set; the conffile itself stays as shipped.
LOCAL=$CONF.d/local.conf
conf_set() {
    testkit local-conf "$TMP/local.json" "$LOCAL" "$@"
}
# coupon-fcgi.socket's ListenStream=, bound by root and handed over as fd 3
# on the first connection, as systemd does; the stack's nginx reaches it
# through its own socket path.
LISTEN=$(unit_get coupon-fcgi.socket ListenStream)
read -ra fcgi_start <<<"$(unit_get coupon-fcgi.service ExecStart)"
read -ra sync_start <<<"$(unit_get coupon-sync.service ExecStart)"
check_eq "coupon-fcgi.service ExecStart=" "/usr/sbin/coupon-fcgi -c $CONF" "${fcgi_start[*]}"
check_eq "coupon-sync.service ExecStart=" "/usr/sbin/coupon-sync -c $CONF" "${sync_start[*]}"
# shellcheck disable=SC2034 # node_http reads it
NODE_SOCK_pkg=$LISTEN

# units_start NAME: both services as their units start them, logs in
# $TMP/NAME-fcgi.log and $TMP/NAME-sync.log; FCGI_PID, SYNC_PID.
units_start() {
    rm -f "$LISTEN"
    (cd / && exec systemd-socket-activate -l "$LISTEN" \
        setpriv --reuid="$U" --regid="$G" --init-groups -- "${fcgi_start[@]}") \
        >"$TMP/$1-fcgi.log" 2>&1 </dev/null 9>&- &
    FCGI_PID=$!
    (cd / && exec setpriv --reuid="$U" --regid="$G" --init-groups -- "${sync_start[@]}") \
        >"$TMP/$1-sync.log" 2>&1 </dev/null 9>&- &
    SYNC_PID=$!
    PIDS=("$FCGI_PID" "$SYNC_PID")
    wait_for 10 test -S "$LISTEN" || return 1
    chown "$(unit_get coupon-fcgi.socket SocketUser):$(unit_get coupon-fcgi.socket SocketGroup)" \
        "$LISTEN"
    chmod "$(unit_get coupon-fcgi.socket SocketMode)" "$LISTEN"
}
units_stop() {
    local p
    for p in "${PIDS[@]}"; do stop_bg "$p"; done
    PIDS=()
    rm -f "$LISTEN"
}

# Before the admin's edit, with MySQL and Redis where nothing answers: the
# services keep running (no exit, so no restart loop) and say what is wrong.
conf_set redis.port=1 mysql.port=1
units_start unreachable
node_http pkg GET /market/health
check_eq "MySQL and Redis unreachable: coupon-fcgi answers health 503" 503 "$HTTP_CODE"
sleep 3
check "... and is still running 3 s later" pid_alive "$FCGI_PID"
check "... so is coupon-sync" pid_alive "$SYNC_PID"
check_match "coupon-sync logs that it cannot reach MySQL" \
    "MySQL failing: .*Can't connect to server on '127\.0\.0\.1'" "$(cat "$TMP/unreachable-sync.log")"
check_match "coupon-fcgi logs that it cannot reach MySQL" \
    "Can't connect to server on '127\.0\.0\.1'" "$(cat "$TMP/unreachable-fcgi.log")"
check_match "... and that its schema is checked at the next start" \
    "schema not checked: MySQL cannot be reached" "$(cat "$TMP/unreachable-fcgi.log")"
units_stop

# --- the schema: migrations twice, an older or newer one refused ------------------------

# The installed migrations on the stack's database (made from the same
# files) once more, as root: every file is safe to run twice.
again=0
for f in /usr/share/couponseize/sql/[0-9]*.sql; do
    mysql_root_q "$(cat "$f")" >/dev/null 2>"$TMP/again.err" || { again=1; sed 's/^/# /' "$TMP/again.err"; }
done
check_eq "every installed migration runs a second time without an error" 0 "$again"
conf_set redis.host="\"$REDIS_HOST\"" redis.port="$REDIS_PORT" \
    mysql.host='"127.0.0.1"' mysql.port="$MYSQL_PORT" \
    mysql.user="\"$MYSQL_USER\"" mysql.password="\"$MYSQL_PASSWORD\"" \
    mysql.database="\"$MYSQL_DATABASE\""
last=$(mysql_root_q "SELECT MAX(version) FROM schema_migration")
mysql_root_q "DELETE FROM schema_migration WHERE version = '$last'"
out=$(as_unit timeout 20 "${sync_start[@]}" 2>&1)
check_eq "a migration not recorded: coupon-sync refuses to start (exit 1)" 1 "$?"
check_match "... naming the command that migrates" \
    "refusing to start: the database schema is older .*run \"couponseize-admin migrate\"" "$out"
out=$(as_unit timeout 20 /usr/sbin/coupon-fcgi -c "$CONF" 2>&1)
check_eq "... so does coupon-fcgi" 1 "$?"
check_match "... naming the command too" 'couponseize-admin migrate' "$out"
mysql_root_q "INSERT INTO schema_migration (version) VALUES ('$last'), ('999_from_the_future')"
out=$(as_unit timeout 20 "${sync_start[@]}" 2>&1)
check_eq "a migration this version does not know: coupon-sync refuses to start" 1 "$?"
check_match "... saying the schema is newer" "schema is newer than this build knows.*999_from_the_future" "$out"
mysql_root_q "DELETE FROM schema_migration WHERE version = '999_from_the_future'"

# --- configure as an admin, start, seize ----------------------------------------------

T_START=$(date +%s%3N)
check "the admin points the configuration at the stack" conf_set \
    redis.host="\"$REDIS_HOST\"" redis.port="$REDIS_PORT" \
    mysql.host='"127.0.0.1"' mysql.port="$MYSQL_PORT" \
    mysql.user="\"$MYSQL_USER\"" mysql.password="\"$MYSQL_PASSWORD\"" \
    mysql.database="\"$MYSQL_DATABASE\"" \
    fcgi.workers=2 preheat.interval_s=1 sync.interval_s=1 sync.threads=2
units_start run
ln -sfn "$LISTEN" "$COUPON_FCGI_SOCK"

health_is() { [[ $(http_code GET /market/health) == "$1" ]]; }
check "the installed coupon-fcgi answers health 200 through nginx" wait_for 30 health_is 200

AID=4201
mk_activity "$AID" 100000 -60 3600
preheated() { [[ -n $(stock_of "$AID") ]]; }
check "the installed coupon-sync preheats the sale into Redis" wait_for 30 preheated
COUPON_JWT_SECRET=$SECRET
seize_settled "$AID" "$(mint_jwt 777)"
T_SEIZED=$(date +%s%3N)
check_eq "a seize through the installed binary, with the postinst secret" SEIZED "$SEIZE_CODE"
FIRST=$(((T_INST - T0) + (T_SEIZED - T_START)))
diag "install to first seize: ${FIRST} ms (dpkg -i $((T_INST - T0)) ms; configure, start," \
    "preheat, seize $((T_SEIZED - T_START)) ms; the test's own checks between them not counted)"
check "the installed coupon-sync writes the coupon to MySQL" wait_for 20 sql_is \
    "SELECT COUNT(*) FROM coupon WHERE activity_id = $AID AND user_id = 777" 1
check_match "coupon-fcgi found the schema it expects" 'database schema [0-9]+, as this build expects' \
    "$(cat "$TMP/run-fcgi.log")"
check "the reserve keeper writes its journal in $STATE/journal" \
    test -s "$STATE/journal/incarnation"
check_eq "... as the unit's user" "$PKG" "$(stat -c %U "$STATE/journal/incarnation" 2>/dev/null)"

units_stop
check_match "coupon-fcgi stopped cleanly" 'coupon-fcgi stopped' "$(cat "$TMP/run-fcgi.log")"
check_match "coupon-sync stopped cleanly" 'coupon-sync stopped' "$(cat "$TMP/run-sync.log")"

# --- the install path of doc/operations.md, as a sysadmin walks it -----------------------

# The blocks of doc/operations.md fenced as ```sh test, run as written in one
# bash shell (its comment near the top says how), on this installed package:
# the token key, the database and its grant, migrations, Redis from the
# shipped fragment, the admin's settings, the nginx site, a sale. Then a
# second node on 127.0.2.202 with the same key, 10,000 users seized across both
# nodes, every SEIZED user's coupon in MySQL after coupon-sync drains, and
# the shipped alert rules quiet on what the nodes report.
#
# The servers are this machine's own binaries, where the docs' commands find
# them: mariadbd (a data directory of this test's, no TCP) on the default
# socket /run/mysqld/mysqld.sock; redis-server and nginx as their installed
# units start them, on their configuration in /etc, which the blocks edit.
# Redis listens on 127.0.0.1:6379 (Debian's redis.conf), nginx on what the
# doc's site says: $listen, which the test sets to 127.0.2.201 and a free
# port (127.0.2.1-4 are tests/stack's nodes).
# Every file of /etc the blocks change is put back at exit, every server
# stopped, what they wrote in /var removed. Without systemd, a systemctl line
# is done from the installed units' Exec*= lines (svc_* below); with systemd
# running this part is skipped (it would start the system's services).
WALK=$TMP/walk
WALK_ON=0
WALK_SKIP=""
for c in mariadbd mariadb redis-server redis-cli nginx curl promtool python3; do
    command -v "$c" >/dev/null 2>&1 || [[ -x /usr/sbin/$c ]] || WALK_SKIP="$c is not installed"
done
[[ -x $LOADGEN ]] || WALK_SKIP="$LOADGEN is not built"
[[ -f /etc/redis/redis.conf ]] || WALK_SKIP="no /etc/redis/redis.conf (redis-server's package)"
[[ -d /etc/nginx/sites-enabled ]] || WALK_SKIP="no /etc/nginx/sites-enabled (Debian's nginx)"
[[ -d /run/systemd/system ]] && WALK_SKIP="systemd runs here: its services are not this test's to start"
[[ -e /run/mysqld/mysqld.sock || -e /run/redis ]] && WALK_SKIP="a MariaDB or Redis of the system runs here"
# (an nginx -t of the system's configuration leaves an empty pid file)
[[ -s /run/nginx.pid ]] && pid_alive "$(cat /run/nginx.pid)" && WALK_SKIP="the system's nginx runs here"
(exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null && WALK_SKIP="something listens on 127.0.0.1:6379"
[[ -e /etc/nginx/sites-available/couponseize ]] && WALK_SKIP="/etc/nginx/sites-available/couponseize exists"

# svc_file UNIT / svc_lines UNIT KEY: the installed unit, and each KEY= of it.
svc_file() {
    local d
    for d in /etc/systemd/system /lib/systemd/system /usr/lib/systemd/system; do
        [[ -f $d/$1 ]] && { printf '%s\n' "$d/$1"; return 0; }
    done
    return 1
}
svc_lines() { sed -n "s/^$2=//p" "$(svc_file "$1")"; }
svc_pid() { cat "$WALK/pid.$1" 2>/dev/null; }
svc_running() { pid_alive "$(svc_pid "$1")"; }
# svc_argv UNIT LINE: one Exec line as systemd runs it, into SVC_ARGV and
# SVC_IGN (a "-" prefix): as the unit's User=/Group= (not for "+"), $MAINPID
# filled in.
svc_argv() {
    local line=$2 priv=1 u g
    SVC_IGN=0
    while [[ $line == [-+@:!]* ]]; do
        case ${line:0:1} in -) SVC_IGN=1 ;; +|!) priv=0 ;; esac
        line=${line:1}
    done
    line=${line//\$MAINPID/$(svc_pid "$1")}
    eval "SVC_ARGV=($line)"
    u=$(svc_lines "$1" User | head -n 1) g=$(svc_lines "$1" Group | head -n 1)
    if ((priv)) && [[ -n $u ]]; then
        SVC_ARGV=(setpriv --reuid="$u" --regid="${g:-$u}" --init-groups -- "${SVC_ARGV[@]}")
    fi
}
svc_exec() {
    svc_argv "$1" "$2"
    (cd / && exec "${SVC_ARGV[@]}") </dev/null >>"$WALK/$1.log" 2>&1 9>&- || ((SVC_IGN))
}
svc_start() {
    local unit=$1 l d u g type sock listen mode
    svc_running "$unit" && return 0
    u=$(svc_lines "$unit" User | head -n 1) g=$(svc_lines "$unit" Group | head -n 1)
    mode=$(svc_lines "$unit" RuntimeDirectoryMode | head -n 1)
    for d in $(svc_lines "$unit" RuntimeDirectory); do
        install -d -m "${mode:-0755}" -o "${u:-root}" -g "${g:-${u:-root}}" "/run/$d"
    done
    while IFS= read -r l; do
        [[ -n $l ]] || continue
        svc_exec "$unit" "$l" || { echo "# $unit: ExecStartPre=$l failed" >&2; return 1; }
    done < <(svc_lines "$unit" ExecStartPre)
    type=$(svc_lines "$unit" Type | head -n 1)
    l=$(svc_lines "$unit" ExecStart | head -n 1)
    if [[ $type == forking ]]; then
        svc_exec "$unit" "$l" || return 1
        wait_for 20 test -s "$(svc_lines "$unit" PIDFile)" || return 1
        cp "$(svc_lines "$unit" PIDFile)" "$WALK/pid.$unit"
        return 0
    fi
    svc_argv "$unit" "$l"
    sock=${unit%.service}.socket
    if svc_file "$sock" >/dev/null; then
        # The socket unit's ListenStream=, bound and handed over on the first
        # connection as systemd does.
        listen=$(svc_lines "$sock" ListenStream | head -n 1)
        rm -f "$listen"
        SVC_ARGV=(systemd-socket-activate -l "$listen" "${SVC_ARGV[@]}")
    fi
    (cd / && exec "${SVC_ARGV[@]}") </dev/null >>"$WALK/$unit.log" 2>&1 9>&- &
    echo $! >"$WALK/pid.$unit"
    if [[ -n ${listen:-} ]]; then
        wait_for 10 test -S "$listen" || return 1
        chown "$(svc_lines "$sock" SocketUser):$(svc_lines "$sock" SocketGroup)" "$listen"
        chmod "$(svc_lines "$sock" SocketMode)" "$listen"
        # A first connection, so the service runs (and takes signals) at once.
        python3 -c 'import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])' \
            "$listen" || true
        wait_for 10 eval '[[ $(cat /proc/$(svc_pid '"$unit"')/comm 2>/dev/null) != systemd-socket* ]]'
    fi
    case $unit in
    redis-server.service) wait_for 20 eval '[[ $(redis-cli ping 2>/dev/null) == PONG ]]' ;;
    *) nap 0.5; svc_running "$unit" ;;
    esac
}
svc_stop() {
    local unit=$1 l pid d stops
    pid=$(svc_pid "$unit")
    stops=$(svc_lines "$unit" ExecStop)
    if [[ -n $stops ]] && pid_alive "$pid"; then
        while IFS= read -r l; do svc_exec "$unit" "$l"; done <<<"$stops"
    elif pid_alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null
    fi
    pid_alive "$pid" && ! wait_for 30 eval '! pid_alive '"$pid" && kill -KILL "$pid" 2>/dev/null
    rm -f "$WALK/pid.$unit"
    for d in $(svc_lines "$unit" RuntimeDirectory); do rm -rf "/run/$d"; done
    return 0
}
# upgrade_child OLD: the supervisor that took over from OLD in an in-place
# upgrade: the process whose environment names OLD in COUPON_FCGI_UPGRADE
# and whose parent's does not (its workers inherit it).
upgrade_child() {
    local f pid ppid
    for f in $(grep -laE "COUPON_FCGI_UPGRADE=[0-9]+:$1:" /proc/[0-9]*/environ 2>/dev/null); do
        pid=${f#/proc/} pid=${pid%/environ}
        ppid=$(awk '/^PPid:/ { print $2 }' "/proc/$pid/status" 2>/dev/null) || continue
        [[ -n $ppid ]] || continue
        grep -qaE "COUPON_FCGI_UPGRADE=[0-9]+:$1:" "/proc/$ppid/environ" 2>/dev/null && continue
        echo "$pid"
        return 0
    done
}
# walk_systemctl VERB UNIT...: what systemctl VERB would do with UNIT.
walk_systemctl() {
    local verb=$1 unit l
    shift
    for unit in "$@"; do
        [[ $unit == *.* ]] || unit=$unit.service
        svc_file "$unit" >/dev/null || { echo "systemctl: unit $unit not found" >&2; return 5; }
        case $verb in
        start) svc_start "$unit" ;;
        stop) svc_stop "$unit" ;;
        restart) svc_stop "$unit" && svc_start "$unit" ;;
        reload)
            # nginx is started by its package; here it starts at its first reload.
            if ! svc_running "$unit"; then
                [[ $unit == nginx.service ]] && { svc_start "$unit"; continue; }
                echo "systemctl: $unit is not active, cannot reload" >&2
                return 1
            fi
            local was replaced=0
            was=$(svc_pid "$unit")
            [[ $unit == coupon-fcgi.service ]] && ! [[ /proc/$was/exe -ef /usr/sbin/coupon-fcgi ]] &&
                replaced=1
            while IFS= read -r l; do
                svc_exec "$unit" "$l" || return 1
            done < <(svc_lines "$unit" ExecReload)
            # A new build at the binary's path: the supervisor upgrades in
            # place, and the new one becomes the main process (MAINPID=).
            if ((replaced)); then
                wait_for 60 eval '! pid_alive '"$was"' && [[ -n $(upgrade_child '"$was"') ]]' || return 1
                upgrade_child "$was" >"$WALK/pid.$unit"
            fi
            ;;
        enable | daemon-reload) ;;
        *) echo "systemctl $verb: not done by this test" >&2; return 1 ;;
        esac || return 1
    done
}

# addr_port ADDR: a port nothing listens on at ADDR now (the kernel's pick).
addr_port() {
    python3 -c 'import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' "$1"
}

# walk_blocks FILE: the ```sh test blocks of FILE, each after a line saying
# where it starts.
walk_blocks() {
    awk -v f="${1##*/}" '/^```sh test$/ { on = 1; printf "walk_at %s:%d\n", f, NR; next }
        on && /^```/ { on = 0; next } on { print }' "$1"
}

# What the walk changes outside $TMP, put back by walk_cleanup.
walk_cleanup() {
    ((WALK_ON)) || return 0
    local u p
    for p in "$WALK"/pid.bg-*; do
        [[ -f $p ]] && { kill -TERM "$(cat "$p")" 2>/dev/null; wait_for 20 eval '! pid_alive '"$(cat "$p")"; }
        rm -f "$p"
    done
    for u in coupon-fcgi.service coupon-sync.service nginx.service redis-server.service; do
        svc_stop "$u"
    done
    if [[ -f $WALK/db.pid ]]; then
        kill -TERM "$(cat "$WALK/db.pid")" 2>/dev/null
        wait_for 60 eval '! pid_alive '"$(cat "$WALK/db.pid")" || kill -KILL "$(cat "$WALK/db.pid")"
    fi
    rm -f /run/mysqld/mysqld.sock /run/mysqld/mysqld.sock.lock
    cp -p "$WALK/etc/redis.conf" /etc/redis/redis.conf
    rm -f /etc/nginx/sites-enabled/couponseize /etc/nginx/sites-available/couponseize
    [[ -L $WALK/etc/default-site ]] && cp -P "$WALK/etc/default-site" /etc/nginx/sites-enabled/default
    # What the servers wrote in /var: new files removed, logs cut back.
    comm -13 "$WALK/var.before" <(find /var/lib/redis /var/log/redis -mindepth 1 2>/dev/null | sort) |
        xargs -r rm -rf
    while read -r size f; do truncate -s "$size" "$f"; done <"$WALK/logs.before"
    rm -f /dev/shm/couponseize-node2* "$LISTEN"
    [[ -f $WALK/nginx.pid.was ]] && [[ ! -e /run/nginx.pid ]] && : >/run/nginx.pid
    WALK_ON=0
}

if [[ -n $WALK_SKIP ]]; then
    ok "the install path of doc/operations.md # SKIP $WALK_SKIP"
else
    T_WALK=$SECONDS
    mkdir -p "$WALK/etc" "$WALK/db/tmp"
    cp -p /etc/redis/redis.conf "$WALK/etc/redis.conf"
    [[ -L /etc/nginx/sites-enabled/default ]] && cp -P /etc/nginx/sites-enabled/default "$WALK/etc/default-site"
    [[ -e /run/nginx.pid ]] && : >"$WALK/nginx.pid.was"
    find /var/lib/redis /var/log/redis -mindepth 1 2>/dev/null | sort >"$WALK/var.before"
    find /var/log/nginx /var/log/redis -maxdepth 1 -type f -printf '%s %p\n' 2>/dev/null >"$WALK/logs.before"
    WALK_ON=1

    # MariaDB as the system's would answer "sudo mariadb": on the default
    # socket, root by the socket's credentials; no TCP at all.
    tpl=$(find "$top_builddir/tests/mysql-template" -mindepth 2 -maxdepth 2 -name 'done' 2>/dev/null | head -n 1)
    if [[ -n $tpl ]]; then
        cp -a "${tpl%/done}/data" "$WALK/db/data"
    else
        mariadb-install-db --no-defaults --datadir="$WALK/db/data" --user=root --skip-test-db \
            --auth-root-authentication-method=normal >"$WALK/db/install.log" 2>&1
    fi
    mkdir -p /run/mysqld
    (exec mariadbd --no-defaults --user=root --datadir="$WALK/db/data" \
        --socket=/run/mysqld/mysqld.sock --skip-networking --pid-file="$WALK/db/mariadbd.pid" \
        --log-error="$WALK/db/error.log" --tmpdir="$WALK/db/tmp" --innodb-buffer-pool-size=64M \
        --innodb-log-file-size=48M) </dev/null >/dev/null 2>&1 9>&- &
    echo $! >"$WALK/db.pid"
    check "MariaDB answers on /run/mysqld/mysqld.sock" \
        wait_for 60 eval 'mariadb -e "SELECT 1" >/dev/null 2>&1'
    # coupon-fcgi and coupon-sync run, as postinst left them (unable to reach
    # MySQL or Redis yet).
    rm -f "$LOCAL"
    walk_systemctl start coupon-fcgi coupon-sync
    check "as installed, coupon-fcgi and coupon-sync run" eval \
        'svc_running coupon-fcgi.service && svc_running coupon-sync.service'

    # The token issuer's key, and where nginx may listen: what only the admin
    # knows.
    od -An -N32 -tx1 /dev/urandom | tr -d ' \n' | sed 's/^/issuer-/' >"$WALK/issuer-key.txt"
    echo >>"$WALK/issuer-key.txt"
    A1=127.0.2.201 A2=127.0.2.202
    P1=$(addr_port "$A1")
    {
        echo 'walk_at() { printf "# %s\n" "$1" >&2; WALK_LINE=$1; }'
        echo 'sudo() { "$@"; }'
        echo 'systemctl() { walk_systemctl "$@"; }'
        echo "listen=$A1:$P1"
        walk_blocks "$top_srcdir/doc/operations.md"
        echo 'declare -p id pw >"$WALK/vars"'
    } >"$WALK/steps.sh"
    diag "doc/operations.md: $(grep -c '^walk_at' "$WALK/steps.sh") blocks marked sh test"
    (cd "$WALK" && set -e && . ./steps.sh) >"$WALK/steps.log" 2>&1
    rc=$?
    if ((rc == 0)); then
        ok "every sh test block of doc/operations.md runs as written"
    else
        not_ok "every sh test block of doc/operations.md runs as written" \
            "$(grep '^# operations' "$WALK/steps.log" | tail -n 1): exit $rc
$(tail -n 25 "$WALK/steps.log")"
    fi
    # Once more: each block is safe to run twice (a second sale is made).
    (cd "$WALK" && set -e && . ./steps.sh) >>"$WALK/steps.log" 2>&1
    check_eq "... and a second time (each is safe to run twice)" 0 "$?"
    id="" pw=""
    # shellcheck source=/dev/null
    [[ -f $WALK/vars ]] && . "$WALK/vars"
    check_match "the documented create made a sale (its id in \$id)" '^[0-9]+$' "$id"
    # mdb SQL: as MariaDB's root over the default socket, as the docs do.
    mdb() { mariadb -N -B couponseize -e "$1"; }
    check_eq "the application's user holds exactly the documented grant" \
        "GRANT DELETE ON \`couponseize\`.\`admin_idempotency\` TO \`couponseize\`@\`localhost\`
GRANT SELECT, INSERT, UPDATE ON \`couponseize\`.* TO \`couponseize\`@\`localhost\`
GRANT USAGE ON *.* TO \`couponseize\`@\`localhost\` IDENTIFIED BY PASSWORD '<hash>'" \
        "$(mariadb -N -B -e 'SHOW GRANTS FOR couponseize@localhost' 2>&1 |
            sed "s/PASSWORD '[^']*'/PASSWORD '<hash>'/" | sort)"
    check_eq "Redis runs appendonly yes, appendfsync always (the shipped fragment)" "yes always" \
        "$(redis-cli CONFIG GET appendonly | tail -n 1) $(redis-cli CONFIG GET appendfsync | tail -n 1)"
    check_eq "migrate a second time applies nothing and succeeds" 0 \
        "$(couponseize-admin migrate >/dev/null 2>&1; echo $?)"
    walk_health() { [[ $(curl -s -o /dev/null -w '%{http_code}' "http://$A1:$P1/market/health") == 200 ]]; }
    check "node 1 answers health 200 through the doc's nginx site" wait_for 30 walk_health

    # Node 2: the same package's coupon-fcgi on this machine, as a second web
    # node would run it: its own configuration (the same settings and the
    # same key, copied as "The token key" says), its own socket, shared
    # memory and journal, its own nginx on $A2 with the shipped
    # snippet; the same Redis and MySQL.
    N2=$WALK/node2
    P2=$(addr_port "$A2")
    chmod 711 "$TMP" "$WALK"
    install -d -o "$PKG" -g "$PKG" -m 0750 "$N2"
    install -d -o "$PKG" -g "$PKG" -m 0700 "$N2/journal"
    install -d -m 0755 "$N2/nginx" "$N2/nginx/tmp"
    install -d -o root -g "$PKG" -m 0750 "$N2/couponseize.conf.d"
    install -m 0640 -o root -g "$PKG" "$CONF" "$N2/couponseize.conf"
    install -m 0640 -o root -g "$PKG" "$LOCAL" "$N2/couponseize.conf.d/local.conf"
    sh -c 'umask 027 && cat >"$1" && chgrp couponseize "$1"' sh "$N2/jwt_secret" </etc/couponseize/jwt_secret
    cat >"$N2/couponseize.conf.d/node2.conf" <<EOF
fcgi = { listen = "$N2/fcgi.sock"; shm_name = "/couponseize-node2"; workers = 2; };
fallback = { journal = "$N2/journal"; };
auth = { jwt_secret_file = "$N2/jwt_secret"; };
EOF
    chgrp "$PKG" "$N2/couponseize.conf.d/node2.conf"
    chmod 0640 "$N2/couponseize.conf.d/node2.conf"
    (cd / && exec setpriv --reuid="$PKG" --regid="$PKG" --init-groups -- \
        /usr/sbin/coupon-fcgi -c "$N2/couponseize.conf") </dev/null >"$N2/fcgi.log" 2>&1 9>&- &
    echo $! >"$WALK/pid.bg-node2-fcgi"
    sed "s#unix:/run/couponseize/fcgi.sock#unix:$N2/fcgi.sock#" \
        /usr/share/couponseize/examples/nginx/couponseize.conf >"$N2/nginx/couponseize.conf"
    cp /etc/nginx/fastcgi_params "$N2/nginx/"
    cat >"$N2/nginx/nginx.conf" <<EOF
user root;
worker_processes 1;
pid $N2/nginx/nginx.pid;
error_log $N2/nginx/error.log warn;
daemon off;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $N2/nginx/tmp/body;
    fastcgi_temp_path $N2/nginx/tmp/fastcgi;
    proxy_temp_path $N2/nginx/tmp/proxy;
    uwsgi_temp_path $N2/nginx/tmp/uwsgi;
    scgi_temp_path $N2/nginx/tmp/scgi;
    server {
        listen $A2:$P2;
        server_name _;
        include $N2/nginx/couponseize.conf;
    }
}
EOF
    (exec nginx -c "$N2/nginx/nginx.conf" -p "$N2/nginx/" -e "$N2/nginx/error.log") \
        </dev/null >/dev/null 2>&1 9>&- &
    echo $! >"$WALK/pid.bg-node2-nginx"
    walk_health2() { [[ $(curl -s -o /dev/null -w '%{http_code}' "http://$A2:$P2/market/health") == 200 ]]; }
    check "node 2 ($A2, the same key) answers health 200" wait_for 30 walk_health2

    # The metrics both nodes show an admin, as Prometheus would scrape them.
    walk_scrape() {
        local tok
        tok=$(couponseize-admin token 2>/dev/null)
        curl -s -H "Authorization: Bearer $tok" "http://$A1:$P1/market/admin/metrics" >"$WALK/$1-n1.prom"
        curl -s -H "Authorization: Bearer $tok" "http://$A2:$P2/market/admin/metrics" >"$WALK/$1-n2.prom"
    }
    walk_scrape before

    # 10,000 users, 5,000 through each node, at once.
    KEYTXT=$(head -n 1 "$WALK/issuer-key.txt")
    t=$SECONDS
    "$LOADGEN" -h "$A1" -p "$P1" -s "$KEYTXT" -a "$id" -c 16 -n 5000 -b 1000000 \
        -L "$WALK/load1.log" -j >"$WALK/load1.json" 2>&1 9>&- &
    l1=$!
    echo "$l1" >"$WALK/pid.bg-load1"
    "$LOADGEN" -h "$A2" -p "$P2" -s "$KEYTXT" -a "$id" -c 16 -n 5000 -b 2000000 \
        -L "$WALK/load2.log" -j >"$WALK/load2.json" 2>&1 9>&- &
    l2=$!
    echo "$l2" >"$WALK/pid.bg-load2"
    wait "$l1" "$l2"
    diag "10,000 seizes over both nodes in $((SECONDS - t)) s: node 1 $(tr -d '\n' <"$WALK/load1.json" | head -c 300)"
    diag "node 2 $(tr -d '\n' <"$WALK/load2.json" | head -c 300)"
    seized_n() { awk 'NR > 1 && $3 == "SEIZED"' "$WALK/load1.log" "$WALK/load2.log" | wc -l; }
    NSEIZED=$(seized_n)
    check_eq "all 10,000 users are told SEIZED" 10000 "$NSEIZED"
    check_eq "... 5,000 of them by node 2, whose key is a copy of node 1's" 5000 \
        "$(awk 'NR > 1 && $3 == "SEIZED"' "$WALK/load2.log" | wc -l)"
    t=$SECONDS
    check "coupon-sync drains them into MySQL (its interval_s as shipped)" wait_for 240 \
        eval '[[ $(mdb "SELECT COUNT(*) FROM coupon WHERE activity_id = $id") -ge $NSEIZED ]]'
    diag "drained in $((SECONDS - t)) s"
    # Per user: told SEIZED => exactly one coupon; a coupon => told SEIZED.
    mdb "SELECT user_id, COUNT(*) FROM coupon WHERE activity_id = $id GROUP BY user_id" >"$WALK/rows"
    bad=$(checker strict "$WALK/rows" "$WALK/load1.log" "$WALK/load2.log")
    check_eq "per user: each one told SEIZED holds exactly one coupon, and nobody else holds one" 0 "$bad"

    # The alerts: the shipped rules over what both nodes report, before and
    # after the sale (with up = 1 for each), evaluated by promtool: none fires.
    walk_scrape after
    RULES=/usr/share/couponseize/prometheus/couponseize-alerts.yml
    # walk_rules_test [control]: the promtool test, to stdout; "control":
    # node 2's couponseize_redis_aof_always 0 after the sale.
    walk_rules_test() {
        testkit promtool-test "$WALK" "$RULES" "${1:-}"
    }
    walk_rules_test >"$WALK/quiet.test.yml"
    walk_rules_test control >"$WALK/control.test.yml"
    check_eq "both nodes see Redis fsync every write (couponseize_redis_aof_always)" "1 1" \
        "$(sed -n 's/^couponseize_redis_aof_always\({[^}]*}\)\{0,1\} \([0-9.]*\)$/\2/p' "$WALK/after-n1.prom" "$WALK/after-n2.prom" |
            tr '\n' ' ' | sed 's/ $//')"
    # The control: the same series with node 2's Redis not durable fire.
    out=$(promtool test rules "$WALK/control.test.yml" 2>&1)
    check_match "... and the same rules fire CouponRedisNotDurable when node 2 reports 0 (the control)" \
        'alertname: CouponRedisNotDurable' "$out"
    out=$(promtool test rules "$WALK/quiet.test.yml" 2>&1)
    rc=$?
    if ((rc == 0)); then ok "the shipped alert rules stay quiet on both nodes' metrics, before and after the sale"
    else not_ok "the shipped alert rules stay quiet on both nodes' metrics, before and after the sale" \
        "$(grep -E 'alertname|FAILED|exp:|got:' <<<"$out" | head -n 20)"; fi
    diag "the install path of doc/operations.md, two nodes, 10,000 users: $((SECONDS - T_WALK)) s"
fi

# --- reinstall and upgrade keep the admin's settings and key, without a question ------------

sums() { md5sum "$CONF" "$LOCAL" "$KEY" | cut -d' ' -f1 | tr '\n' ' '; }
# The admin's own key (the issuer's), put in place as operations.md says:
# from standard input, never on a command line.
SECRET=an-admin-chosen-secret-of-more-than-32-characters
printf '%s\n' "$SECRET" | sh -c 'umask 027 && cat >/etc/couponseize/jwt_secret.new &&
    chgrp couponseize /etc/couponseize/jwt_secret.new &&
    mv /etc/couponseize/jwt_secret.new /etc/couponseize/jwt_secret'
sum=$(sums)
check "dpkg -i of the same package again" dpkg_do -i "$DEB"
check_eq "reinstall: conffile, local settings and key untouched" "$sum" "$(sums)"

# A next version whose shipped configuration changed: the conffile is as
# shipped (nothing edited it), so dpkg replaces it without asking, with no
# --force-conf* option and no terminal to answer on; the admin's settings
# and key stay.
R=$TMP/next
dpkg-deb -R "$DEB" "$R"
sed -i 's/^Version: .*/&+next1/' "$R/DEBIAN/control"
echo "# a new default in the next version" >>"$R$CONF"
(cd "$R" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | xargs -0 md5sum) \
    >"$R/DEBIAN/md5sums"
check "the next version builds (dpkg-deb -b)" quietly dpkg-deb --root-owner-group -b "$R" "$TMP/next.deb"
local_sum=$(md5sum "$LOCAL" "$KEY")
check "dpkg -i upgrades to it with no --force-conf* option, stdin closed" \
    dpkg_do -i "$TMP/next.deb" </dev/null
check_eq "... and asked nothing about a configuration file" "" \
    "$(grep -iE 'configuration file|\(Y/I/N/O/D/Z\)' "$TMP/dpkg.log")"
check_match "upgrade: installed version is the next one" '\+next1$' \
    "$(dpkg-query -W -f='${Version}' "$PKG")"
check_match "upgrade: the new conffile is in place" 'a new default' "$(tail -n 1 "$CONF")"
check_eq "upgrade: no .dpkg-dist or .dpkg-old beside it" "" \
    "$(ls /etc/couponseize/ | grep -E 'dpkg-(dist|old|new)')"
check_eq "upgrade: the admin's settings and key are untouched" "$local_sum" "$(md5sum "$LOCAL" "$KEY")"
check_eq "upgrade: still 0640 root:couponseize" "640 root $PKG" \
    "$(stat -c '%a %U %G' "$CONF" 2>/dev/null)"
check "coupon-fcgi -t accepts the upgraded configuration with the admin's key (as the unit's user)" \
    quietly as_unit /usr/sbin/coupon-fcgi -t -c "$CONF"
check_eq "coupon-sync's unit cannot reach the journal" "-$STATE/journal" \
    "$(unit_get coupon-sync.service InaccessiblePaths)"

# The node the docs set up, on the upgraded package: the admin's settings
# (couponseize.conf.d/local.conf) and key (the one set above) as they were.
if ((WALK_ON)); then
    walk_systemctl restart coupon-fcgi coupon-sync >>"$WALK/steps.log" 2>&1
    check "upgrade: the documented node starts again on the new conffile and its own settings" \
        wait_for 30 walk_health
    check_match "... and still shows the sale" "\"id\":${id}[,}]" \
        "$(couponseize-admin --json status "$id" 2>&1)"
    code=$("$LOADGEN" -h "$A1" -p "$P1" -s "$SECRET" -a "$id" -c 1 -n 1 -b 3000000 -j 2>&1 9>&-)
    check_match "... and a new user seizes there, with the admin's key" '"SEIZED": *1' "$code"

    # The package's upgrade of a running node, while users seize: dpkg -i
    # of a next version neither stops nor restarts coupon-fcgi, and its
    # postinst asks systemd for a reload (what systemd does with it is
    # walk_systemctl's: the unit's ExecReload=, and the new main process),
    # which finds a new build at the binary's path and upgrades in place.
    # Judged per user: no answer from nginx instead of the service, every
    # SEIZED a coupon in MySQL once coupon-sync (restarted by the package)
    # drained it, every holder told SEIZED.
    check_match "postinst reloads coupon-fcgi on an upgrade" \
        'deb-systemd-invoke try-reload-or-restart coupon-fcgi.service' \
        "$(cat "/var/lib/dpkg/info/$PKG.postinst")"
    # Without systemd here the maintainer scripts' own stop and restart do
    # nothing, so what they would ask systemd is read from them: coupon-fcgi
    # is stopped by prerm only on a removal, and restarted by no script.
    check_eq "prerm stops coupon-fcgi only on a removal" "" \
        "$(awk '/"\$1" = "?remove"?/ { guard = NR } /deb-systemd-invoke stop .*coupon-fcgi\.service/ && guard != NR - 1' \
            "/var/lib/dpkg/info/$PKG.prerm")"
    check_eq "no maintainer script restarts coupon-fcgi" "" \
        "$(grep -hE 'deb-systemd-invoke (try-)?restart .*coupon-fcgi\.service' /var/lib/dpkg/info/$PKG.*inst /var/lib/dpkg/info/$PKG.*rm 2>/dev/null)"
    R2=$TMP/next2
    dpkg-deb -R "$DEB" "$R2"
    sed -i 's/^Version: .*/&+next2/' "$R2/DEBIAN/control"
    echo "# a new default in the next version" >>"$R2$CONF"
    echo "# and in the one after" >>"$R2$CONF"
    printf '\n# a build of its own\n' >>"$R2/usr/sbin/coupon-fcgi"
    (cd "$R2" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | xargs -0 md5sum) \
        >"$R2/DEBIAN/md5sums"
    check "the version after builds (dpkg-deb -b)" quietly dpkg-deb --root-owner-group -b "$R2" "$TMP/next2.deb"
    old_main=$(svc_pid coupon-fcgi.service)
    ulog=$WALK/upgrade-load.log
    "$LOADGEN" -h "$A1" -p "$P1" -s "$SECRET" -a "$id" -c 16 -D 300 -n 9000 -R 300 -b 4000000 \
        -L "$ulog" -j >"$WALK/upgrade-load.json" 2>&1 9>&- &
    echo $! >"$WALK/pid.bg-upload"
    check "upgrade under load: the load is answered" wait_for 60 eval '(($(answers "$ulog") >= 300))'
    check "upgrade under load: dpkg -i of the version after, stdin closed" \
        dpkg_do -i "$TMP/next2.deb" </dev/null
    check "... the supervisor that served before dpkg -i serves on" \
        pid_alive "$old_main"
    before=$(answers "$ulog")
    check "... the postinst's reload upgrades it in place" \
        walk_systemctl reload coupon-fcgi >>"$WALK/steps.log" 2>&1
    new_main=$(svc_pid coupon-fcgi.service)
    check "... a new supervisor ($old_main -> $new_main) on the new build" \
        eval '[[ $new_main != "$old_main" && /proc/$new_main/exe -ef /usr/sbin/coupon-fcgi ]]'
    check "... and the load is answered after it" \
        wait_for 60 eval '(($(answers "$ulog") >= before + 300))'
    wait "$(cat "$WALK/pid.bg-upload")"
    rm -f "$WALK/pid.bg-upload"
    walk_systemctl restart coupon-sync >>"$WALK/steps.log" 2>&1
    told=$(awk 'NR > 1 && $3 == "SEIZED"' "$ulog" | wc -l)
    check "upgrade under load: coupon-sync drains the grants into MySQL" wait_for 240 \
        eval '[[ $(mdb "SELECT COUNT(*) FROM coupon WHERE activity_id = $id AND user_id >= 4000000 AND user_id < 5000000") -ge $told ]]'
    read -r nans nseized nbad_s nbad_h nnone < <(
        mdb "SELECT user_id FROM coupon WHERE activity_id = $id AND user_id >= 4000000 AND user_id < 5000000" |
            python3 "$top_srcdir/tests/nemesis/checker.py" loadgen "$ulog" answers seized bad_seized \
                bad_holders no_answer)
    diag "upgrade under load: $nans answers, $nseized SEIZED; $(tr -d '\n' <"$WALK/upgrade-load.json" | head -c 300)"
    check_eq "... no answer from nginx instead of the service (no 502, 504, nothing dropped)" 0 "$nnone"
    if ((nnone > 0)); then
        diag "answers without a code of the service (ms status code user us):"
        diag "$(awk 'NR > 1 && ($3 ~ /^HTTP_5/ || $3 == "CONNECTION_ERROR")' "$ulog" | head -n 20)"
        diag "nginx's error log meanwhile:"
        diag "$(tail -n 20 /var/log/nginx/error.log 2>/dev/null)"
    fi
    check_eq "... every user told SEIZED holds a coupon" 0 "$nbad_s"
    check_eq "... every holder was told SEIZED" 0 "$nbad_h"
    walk_cleanup
fi

# --- purge ----------------------------------------------------------------------------

# A journal file that holds a grant record (as after a reserve grant not yet
# replayed): purge must not delete it.
printf 'record-bytes' >"$STATE/journal/w0.jnl"
chown "$PKG:$PKG" "$STATE/journal/w0.jnl"
check "dpkg --purge" dpkg_do --purge "$PKG"
KEPT=$(find /var/lib -maxdepth 1 -name 'couponseize-journal.*' -print -quit)
check_match "purge moved the journal holding a grant aside" '^/var/lib/couponseize-journal\.' "$KEPT"
check_eq "... with its record" "record-bytes" "$(cat "$KEPT/w0.jnl" 2>/dev/null)"
check_eq "... owned by root, 0700 (the user is gone)" "700 root" "$(stat -c '%a %U' "$KEPT" 2>/dev/null)"
check_match "... and said where, and what to do" "moved to /var/lib/couponseize-journal\." \
    "$(cat "$TMP/dpkg.log")"
[[ -n $KEPT ]] && rm -rf "$KEPT"
check_eq "dpkg knows nothing of the package" "" \
    "$(dpkg-query -W -f='${db:Status-Status}' "$PKG" 2>/dev/null | grep -v not-installed)"
check "nothing left in /etc/couponseize" test ! -e /etc/couponseize
check "nothing left in $STATE" test ! -e "$STATE"
check "nothing left in /run/couponseize" test ! -e /run/couponseize
check_eq "no user couponseize" "" "$(getent passwd "$PKG")"
check_eq "no group couponseize" "" "$(getent group "$PKG")"
check_eq "no dpkg-statoverride left" "" "$(dpkg-statoverride --list | grep -i couponseize)"
check_eq "no unit symlinks or enable state left" "" \
    "$(find /etc/systemd/system /var/lib/systemd/deb-systemd-helper-enabled \
        /var/lib/systemd/deb-systemd-helper-masked -name '*coupon*' 2>/dev/null)"
check "the binaries are gone" test ! -e /usr/sbin/coupon-fcgi -a ! -e /usr/sbin/coupon-sync

finish
