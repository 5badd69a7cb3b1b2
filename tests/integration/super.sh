#!/usr/bin/env bash
# super.sh - the built-in supervisor alone, no stack (Redis and MySQL are
# unreachable; the workers start all the same): (a) children it did not fork
# (a shell that forked before it exec'd the supervisor) are reaped when they
# exit, not left zombies; (b) reloads that pile up more replaced workers than
# the supervisor first holds (each stopped, so it cannot go yet) leave every
# one of them followed: all gone once continued, none a zombie.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

FCGI=$top_builddir/coupon-fcgi
[[ -x $FCGI ]] || skip_all "coupon-fcgi is not built"
DIR=$(mktemp -d "${TMPDIR:-/tmp}/cs-super.XXXXXX") || exit 99
SHM=/cs-super-$$
cat >"$DIR/couponseize.conf" <<EOF
log = { level = "notice"; target = "stderr"; };
fcgi = { listen = "$DIR/fcgi.sock"; workers = 4; shm_name = "$SHM"; };
redis = { host = "127.0.0.1"; port = 1; };
mysql = { host = "127.0.0.1"; port = 1; };
auth = { jwt_secret = "super.sh-0123456789abcdef0123456789"; jwt_secret_file = ""; };
fallback = { reserve = 0; };
EOF
# (a): two children of the shell that becomes the supervisor.
bash -c "sleep 0.5 & sleep 1 & exec '$FCGI' -c '$DIR/couponseize.conf'" 2>"$DIR/fcgi.log" &
sup=$!
stop_all() {
    local p
    for p in $(pgrep -P "$sup"); do kill -KILL "$p"; done
    kill -KILL "$sup" 2>/dev/null
    wait "$sup" 2>/dev/null
    rm -f "/dev/shm/${SHM#/}"
    rm -rf "$DIR"
}
trap 'stop_all' EXIT

children() { pgrep -c -P "$sup"; }
no_zombie() { ! ps -o stat= --ppid "$sup" | grep -q '^Z'; }
only_workers() { [[ $(children) -eq 4 ]] && no_zombie; }
reloads() { grep -c "configuration reloaded" "$DIR/fcgi.log"; }
reloads_at_least() { (($(reloads) >= $1)); }

wait_for 10 grep -q "serving" "$DIR/fcgi.log"
check "(a) the supervisor runs its four workers" wait_for 10 only_workers
check "(a) children it did not fork are reaped once they exit" wait_for 5 no_zombie
check_eq "(a) each is logged" 2 "$(grep -c "no list of the supervisor held" "$DIR/fcgi.log")"

# (b): before each reload its workers are stopped, so the SIGTERM waits for
# a SIGCONT and each reload retires four more: 100 in all.
for i in $(seq 25); do
    for p in $(pgrep -P "$sup"); do kill -STOP "$p"; done
    kill -HUP "$sup"
    wait_for 10 reloads_at_least "$i"
    # The reload's new workers forked too, or the next round would not stop
    # them, and they would go at its SIGHUP.
    # shellcheck disable=SC2016 # expanded by wait_for's eval, in this scope
    wait_for 10 eval '(($(children) >= 4 * (i + 1)))'
done
check_eq "(b) 25 reloads" 25 "$(reloads)"
check "(b) the replaced workers wait, stopped ($(children) children)" test "$(children)" -ge 100
for p in $(pgrep -P "$sup"); do kill -CONT "$p"; done
check "(b) every replaced worker is reaped once continued" wait_for 20 only_workers
only_workers || diag "children by state: $(ps -o stat= --ppid "$sup" | cut -c1 | sort | uniq -c | tr -s ' \n' ' ')"
kill -TERM "$sup"
gone() { ! kill -0 "$sup" 2>/dev/null; }
check "stop: the supervisor ends, its workers with it" wait_for 20 gone
finish
