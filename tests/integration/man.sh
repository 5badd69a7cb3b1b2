#!/usr/bin/env bash
# man.sh - the manual pages are clean under mandoc -Tlint, couponseize.conf(5)
# lists every key of lib/conf.c's table and of etc/couponseize.conf with the
# table's type, range and default, and the pages of the programs name every
# option their usage text offers.
# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

command -v mandoc >/dev/null 2>&1 || skip_all "mandoc is not installed (Debian: mandoc)"
MAN=$top_builddir/gen/man
PAGES=(coupon-fcgi.8 coupon-sync.8 couponseize.conf.5 couponseize-admin.8)
for p in "${PAGES[@]}"; do
    [[ -f $MAN/$p ]] || skip_all "$MAN/$p is not built (run make)"
done

# -Tlint reports everything down to style hints (Xr order, a trailing
# delimiter, an explicit .Os); a clean page prints nothing. What depends on the
# machine is left out: Xr references to pages it lacks (the other pages of this
# package are not installed yet) and mandoc.db being out of date.
for p in "${PAGES[@]}"; do
    out=$(mandoc -Tlint "$MAN/$p" 2>&1 | grep -v -e 'STYLE: referenced manual not found' -e 'mandoc.db lacks')
    check_eq "mandoc -Tlint $p" "" "$out"
    check_eq "no @placeholder@ left in $p" "" "$(grep -o '@[a-z_]*@' "$MAN/$p")"
done

conf_page=$MAN/couponseize.conf.5
# block KEY: the lines of the page's entry for KEY (from ".It Cm KEY" to the
# next .It or .El), joined by spaces.
block() {
    awk -v k="$1" '
        $0 == ".It Cm " k { on = 1; next }
        on && /^\.(It|El)( |$)/ { exit }
        on { printf "%s ", $0 }' "$conf_page"
}

# The table: I("name", field, lo, hi, def), S("name", field, req, def, choices),
# B("name", field, def), L("name", field, def).
table=$(sed -nE 's/^ *([ISBL])\("([a-z_]+\.[a-z_]+)", *[a-z_]+, *(.*)\),$/\1 \2 \3/p' \
    "$top_srcdir/lib/conf.c")
n=0
while read -r type key rest; do
    n=$((n + 1))
    b=$(block "$key")
    if [[ -z $b ]]; then
        not_ok "couponseize.conf(5) documents $key"
        continue
    fi
    IFS=', ' read -r -a a <<<"$rest"
    case $type in
    I) want="Integer from ${a[0]} to ${a[1]}; default ${a[2]}" ;;
    B) want="Boolean; default $([[ ${a[0]} == 1 ]] && echo true || echo false)" ;;
    L) want="List of strings; default []" ;;
    S)
        want="default ${a[1]}"
        choices=${a[2]}
        if [[ $choices != NULL ]]; then
            vals=$(sed -nE "s/^static const char \*const $choices\[\] = \{(.*), NULL\};/\1/p" \
                "$top_srcdir/lib/conf.c")
            want="one of $vals; $want"
        fi
        ;;
    esac
    re=$(sed 's/[][\\.*^$()|+?{}]/\\&/g' <<<"$want")
    # A default given by a macro (the seize script, the journal) is a path of this build.
    # (written as a macro line, which may be as long as the install prefix).
    re=${re/CS_DEFAULT_SCRIPT/\.Qq Pa \/[^ ]*\/seize\\.lua}
    re=${re/CS_DEFAULT_JOURNAL/\.Qq Pa \/[^ ]*\/lib\/couponseize\/journal}
    [[ $type == I ]] && re="$re([^0-9]|$)"
    check_match "couponseize.conf(5): $key: $want" "$re" "$b"
done <<<"$table"
check "lib/conf.c's table read ($n keys)" test "$n" -gt 40

# Every key the shipped example sets is in the page (and so in the table).
while read -r key; do
    check "couponseize.conf(5) documents $key (etc/couponseize.conf)" \
        grep -qxF ".It Cm $key" "$conf_page"
done < <(awk '/^[a-z]+ = \{/ { g = $1 } /^};/ { g = "" }
    g != "" && /^  [a-z_]+ = / { print g "." $1 }' "$top_srcdir/etc/couponseize.conf")

# No key in the page that the programs would refuse.
while read -r key; do
    check "documented key $key is in lib/conf.c" grep -q "\"$key\"" "$top_srcdir/lib/conf.c"
done < <(sed -n 's/^\.It Cm \([a-z_]*\.[a-z_]*\)$/\1/p' "$conf_page")

# Each option in a program's usage text is in its page.
for prog in coupon-fcgi coupon-sync couponseize-admin; do
    # The option lines of the usage text: "  -c PATH", "  -c, --config PATH", "      --once".
    opts=$("$top_builddir/$prog" -h | sed -nE 's/^ +(-[a-z](, --[a-z]+)?|--[a-z]+) .*/\1/p' |
        tr ',' ' ')
    for o in $opts; do
        o=${o#-}
        check "$prog.8 documents -$o" grep -qE "^\.(It|Op) .*Fl $o( |$)|Fl $o\$" "$MAN/$prog.8"
    done
done
finish
