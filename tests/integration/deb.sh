#!/usr/bin/env bash
# deb.sh - the Debian package on this machine: "make deb" builds it and
# lintian passes it, dpkg -i installs it (system user, modes, conffile with a
# fresh secret, units enabled), the installed services run as their units
# run them (ExecStartPre=, ExecStart=, User=, the socket handed over as by
# coupon-fcgi.socket): without MySQL and Redis they keep running and say so,
# pointed at a test stack's they serve a seize; a reinstall and an upgrade
# keep the admin's configuration, and a purge leaves nothing behind.
#
# Installs system-wide, so it needs root and a machine where couponseize is
# not installed (it skips otherwise). Whatever happens, the exit purges the
# package again. Nothing starts through systemd: there may be none running,
# and policy-rc.d refuses service starts while the package is installed.
# shellcheck disable=SC2317 # helpers are called through check and cs_defer
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
# would take its configuration, journal and user.
st=$(dpkg-query -W -f='${db:Status-Status}' "$PKG" 2>/dev/null)
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
check_eq "the configuration is the one conffile" "$CONF" "$(dpkg-deb -I "$DEB" conffiles 2>/dev/null)"
check_eq "nothing enabled in a web server's configuration" "" \
    "$(grep -E '\./etc/(nginx|apache2|lighttpd)/' <<<"$LIST")"

# --- a stack for the installed binaries --------------------------------------------

# Registered before anything is installed, run on every exit: stop the
# installed daemons, purge the package, drop what this test added.
PIDS=()
POLICY_MADE=0
pkg_cleanup() {
    local p
    for p in "${PIDS[@]}"; do stop_bg "$p"; done
    st=$(dpkg-query -W -f='${db:Status-Status}' "$PKG" 2>/dev/null)
    if [[ -n $st && $st != not-installed ]]; then
        dpkg_do --purge --force-all "$PKG" >&2 || echo "# cleanup: dpkg --purge $PKG failed" >&2
    fi
    rm -f /dev/shm/couponseize
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

SECRET=$(sed -n 's/^[[:space:]]*jwt_secret[[:space:]]*=[[:space:]]*"\([^"]*\)";.*/\1/p' "$CONF")
check_match "postinst wrote a random auth.jwt_secret" '^[0-9a-f]{64}$' "$SECRET"
check_eq "the shipped example still has the empty placeholder" 1 \
    "$(grep -c '^[[:space:]]*jwt_secret = "";' /usr/share/couponseize/examples/couponseize.conf)"
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

# conf_set KEY=VALUE...: edits "group.key"s in place in the conffile, inside
# their group, as an admin's editor would (same file, owner and mode).
conf_set() {
    python3 - "$CONF" "$@" <<'PY'
import re, sys
path, edits = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
out, group, done = [], None, set()
for line in open(path):
    m = re.match(r"^([a-z_]+) = \{", line)
    if m:
        group = m.group(1)
    elif line.startswith("};"):
        group = None
    elif group:
        m = re.match(r"^(\s*)([a-z_]+)\s*=.*;\s*$", line)
        key = m and f"{group}.{m.group(2)}"
        if key in edits:
            line = f"{m.group(1)}{m.group(2)} = {edits[key]};\n"
            done.add(key)
    out.append(line)
if set(edits) - done:
    sys.exit("not in the file: " + " ".join(sorted(set(edits) - done)))
open(path, "w").write("".join(out))
PY
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
units_stop

# --- configure as an admin, start, seize ----------------------------------------------

T_START=$(date +%s%3N)
check "the admin points the configuration at the stack" conf_set \
    redis.host="\"$REDIS_HOST\"" redis.port="$REDIS_PORT" \
    mysql.host='"127.0.0.1"' mysql.port="$MYSQL_PORT" \
    mysql.user="\"$MYSQL_USER\"" mysql.password="\"$MYSQL_PASSWORD\"" \
    mysql.database="\"$MYSQL_DATABASE\"" \
    fcgi.workers=2 preheat.interval_s=1 sync.interval_s=1 sync.threads=2
echo "# edited by the admin" >>"$CONF"
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
check "the reserve keeper writes its journal in $STATE/journal" \
    test -s "$STATE/journal/incarnation"
check_eq "... as the unit's user" "$PKG" "$(stat -c %U "$STATE/journal/incarnation" 2>/dev/null)"

units_stop
check_match "coupon-fcgi stopped cleanly" 'coupon-fcgi stopped' "$(cat "$TMP/run-fcgi.log")"
check_match "coupon-sync stopped cleanly" 'coupon-sync stopped' "$(cat "$TMP/run-sync.log")"

# --- reinstall and upgrade keep the admin's configuration ----------------------------

conf_sum() { md5sum "$CONF" | cut -d' ' -f1; }
# The admin's own secret, which postinst must leave alone from now on.
SECRET=an-admin-chosen-secret-of-more-than-32-characters
conf_set auth.jwt_secret="\"$SECRET\""
sum=$(conf_sum)
check "dpkg -i of the same package again" dpkg_do -i "$DEB"
check_eq "reinstall: the admin's configuration is untouched" "$sum" "$(conf_sum)"

# A next version whose shipped configuration changed: dpkg keeps the admin's
# file (--force-confold answers its question) and puts the new one beside it.
R=$TMP/next
dpkg-deb -R "$DEB" "$R"
sed -i 's/^Version: .*/&+next1/' "$R/DEBIAN/control"
echo "# a new default in the next version" >>"$R$CONF"
(cd "$R" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | xargs -0 md5sum) \
    >"$R/DEBIAN/md5sums"
check "the next version builds (dpkg-deb -b)" quietly dpkg-deb --root-owner-group -b "$R" "$TMP/next.deb"
check "dpkg -i --force-confold upgrades to it" dpkg_do -i --force-confold "$TMP/next.deb"
check_match "upgrade: installed version is the next one" '\+next1$' \
    "$(dpkg-query -W -f='${Version}' "$PKG")"
check_eq "upgrade: the admin's configuration is kept" "$sum" "$(conf_sum)"
check_eq "upgrade: the admin's secret is untouched" "$SECRET" \
    "$(sed -n 's/^[[:space:]]*jwt_secret[[:space:]]*=[[:space:]]*"\([^"]*\)";.*/\1/p' "$CONF")"
check_match "upgrade: the new default is beside it as .dpkg-dist" 'a new default' \
    "$(tail -n 1 "$CONF.dpkg-dist" 2>/dev/null)"
check_eq "upgrade: still 0640 root:couponseize" "640 root $PKG" \
    "$(stat -c '%a %U %G' "$CONF" 2>/dev/null)"

# --- purge ----------------------------------------------------------------------------

check "dpkg --purge" dpkg_do --purge "$PKG"
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
