#!/usr/bin/env bash
# layout.sh - the tree keeps the include direction doc/internals.md ("The
# tree") draws: in fcgi/, a room includes only rooms below it (proc > api >
# node > req; the keeper below proc alone), never a room above or beside it;
# lib/ includes nothing of fcgi/ or sync/, and what both daemons share
# (lib/*.c) includes nothing of lib/node/. Counted from the #include lines.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

cd "$top_srcdir" || exit 1
# rank ROOM: a room may include the rooms of a lower rank only.
declare -A rank=([proc]=4 [keeper]=3 [api]=3 [node]=2 [req]=1)
# Rooms of the same rank that still may not include each other.
declare -A apart=([keeper:api]=1 [api:keeper]=1)

rooms=$(find fcgi -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort)
check_eq "fcgi/ holds no file outside a room" "" \
    "$(find fcgi -maxdepth 1 -type f \( -name '*.c' -o -name '*.h' \) | sort)"
for room in $rooms; do
    check "fcgi/$room has a rank in layout.sh" test -n "${rank[$room]:-}"
done

up=()
for room in $rooms; do
    for f in fcgi/"$room"/*.[ch]; do
        [[ -f $f ]] || continue
        while read -r to; do
            [[ -n ${rank[$to]:-} ]] || continue
            if ((rank[$to] >= rank[$room])) && [[ $to != "$room" ]]; then
                up+=("$f -> $to/")
            elif [[ -n ${apart[$room:$to]:-} ]]; then
                up+=("$f -> $to/")
            fi
        done < <(sed -nE 's/^#include "([a-z]+)\/[a-z_]+\.h".*/\1/p' "$f")
        # A header of another room named without its room resolves only
        # through a search path; the tree says where it lives.
        while read -r h; do
            [[ -f fcgi/$room/$h ]] && continue
            for other in $rooms; do
                [[ -f fcgi/$other/$h ]] && up+=("$f names $h without $other/")
            done
        done < <(sed -nE 's/^#include "([a-z_]+\.h)".*/\1/p' "$f")
    done
done
check_eq "no include in fcgi/ runs up or sideways" "" "$(printf '%s\n' "${up[@]}" | sed '/^$/d')"

node_h=$(cd lib/node && ls ./*.h | sed 's#^\./##')
shared_up=()
for f in lib/*.[ch] sync/*.[ch] admin/*.[ch]; do
    [[ -f $f ]] || continue
    while read -r h; do
        grep -qxF "$h" <<<"$node_h" && shared_up+=("$f includes lib/node/$h")
    done < <(sed -nE 's/^#include "([a-z_]+\.h)".*/\1/p' "$f")
    grep -qE '^#include "(proc|api|node|req|keeper)/' "$f" && shared_up+=("$f includes fcgi/")
done
check_eq "lib/, sync/ and admin/ include nothing of lib/node/ or fcgi/" "" \
    "$(printf '%s\n' "${shared_up[@]}" | sed '/^$/d')"
finish
