#!/usr/bin/env bash
# identity.sh - auth.mode = "trusted-header" behind the shipped nginx,
# lighttpd and Apache snippets: the web server sets the caller (user 42, role
# "user") the way each snippet documents, and a client that adds its own
# identity in any spelling (X-User-Id, X_User_Id, X.User.Id, and the same for
# X-User-Role: admin) neither seizes as another user nor reaches an admin
# route. lighttpd passes all three spellings as HTTP_X_USER_ID; the app reads
# only params without the HTTP_ prefix.
#
# nginx is the stack's own, its snippet edited and reloaded; lighttpd and
# Apache are started here the way webservers.sh starts them. A server that is
# not installed is skipped; the test skips (77) only when none is.
# shellcheck disable=SC2317 # helpers are called through check/wait_for/cs_defer
set -u

# shellcheck source=tests/lib.sh
. "${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/lib.sh"

first_exe() {
    local c
    for c in "$@"; do
        if command -v "$c" >/dev/null 2>&1; then command -v "$c"; return 0; fi
        if [[ -x $c ]]; then printf '%s\n' "$c"; return 0; fi
    done
    return 1
}
NGINX=$(first_exe nginx /usr/sbin/nginx) || NGINX=""
LIGHTTPD=$(first_exe lighttpd /usr/sbin/lighttpd) || LIGHTTPD=""
APACHE=$(first_exe apache2 /usr/sbin/apache2 httpd /usr/sbin/httpd) || APACHE=""
APACHE_MODDIR=""
if [[ -n $APACHE ]]; then
    for d in /usr/lib/apache2/modules /usr/lib64/httpd/modules /usr/lib/httpd/modules \
        /usr/libexec/apache2; do
        if [[ -f $d/mod_proxy_fcgi.so ]]; then APACHE_MODDIR=$d; break; fi
    done
fi
[[ -n $NGINX || -n $LIGHTTPD || -n $APACHE ]] ||
    skip_all "none of nginx, lighttpd, apache2 is installed"
skip_unless_cmd cgi-fcgi || exit 77

export COUPON_CONF_OVERRIDES='auth.mode="trusted-header"'
if [[ -n $NGINX ]]; then
    cs_stack_up --no-sync
else
    cs_stack_up --no-sync --no-web
fi

WS=$COUPON_DIR/identity
mkdir -p "$WS"
WEB_USER="" WEB_GROUP=""
if [[ $(id -u) == 0 ]]; then
    if id www-data >/dev/null 2>&1; then WEB_USER=www-data; else WEB_USER=nobody; fi
    WEB_GROUP=$(id -gn "$WEB_USER")
    chmod o+x "$COUPON_DIR"
    chmod 0755 "$WS"
fi

# The caller every server forces, and the one clients claim to be.
FORCED=42
CLAIMED=777

# --- servers ---------------------------------------------------------------------

PORT_REGISTRY=${COUPON_PORT_REGISTRY:-/tmp/couponseize-ports-$(id -u)}
port_free() { testkit port-free "$1"; }
free_port() {
    local i p
    mkdir -p "$PORT_REGISTRY" 2>/dev/null || true
    for ((i = 0; i < 200; i++)); do
        p=$((20000 + (RANDOM * 32768 + RANDOM) % 12000))
        mkdir "$PORT_REGISTRY/$p" 2>/dev/null || continue
        printf '%s\n' "$COUPON_DIR" >"$PORT_REGISTRY/$p/owner"
        printf '%s\n' "$p" >>"$WS/ports"
        if port_free "$p"; then
            printf '%s\n' "$p"
            return 0
        fi
    done
    return 1
}
release_ports() {
    local p
    [[ -f $WS/ports ]] || return 0
    while read -r p; do
        [[ $p =~ ^[0-9]+$ ]] && rm -rf "${PORT_REGISTRY:?}/$p"
    done <"$WS/ports"
}
cs_defer release_ports

stop_server() {
    local pid=$1 i
    own_child "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 100; i++)); do
        pid_alive "$pid" || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
launch_server() {
    local name=$1 port=$2 pid
    shift 2
    "$@" </dev/null >>"$WS/$name/logs/stdout.log" 2>&1 &
    pid=$!
    cs_defer stop_server "$pid"
    if ! wait_for 10 listening "$port" || ! pid_alive "$pid"; then
        not_ok "$name starts" "$(tail -n 20 "$WS/$name/logs/stdout.log" "$WS/$name/logs/error.log" 2>&1)"
        return 1
    fi
}

# snippet FILE: the shipped snippet with the socket path replaced.
snippet() {
    local body
    body=$(<"$top_srcdir/$1")
    body=${body//"/usr/share/couponseize/www"/"$top_srcdir/www"}
    printf '%s\n' "${body//"/run/couponseize/fcgi.sock"/"$COUPON_FCGI_SOCK"}"
}

# uncomment PATTERN: the snippet's commented example line(s) matching
# PATTERN made live, with USER_ID / ROLE and nginx's variables filled in.
uncomment() {
    sed -E "/^[[:space:]]*#[[:space:]]+$1/{
        s/^([[:space:]]*)#[[:space:]]+/\\1/
        s/\"USER_ID\"/\"$FORCED\"/; s/ USER_ID\$/ $FORCED/
        s/\"ROLE\"/\"user\"/; s/ ROLE\$/ user/
        s/\\\$couponseize_user_id;/$FORCED;/; s/\\\$couponseize_user_role;/user;/
    }"
}

declare -A URLS=()

if [[ -n $NGINX ]]; then
    conf=$COUPON_DIR/nginx/couponseize.conf
    uncomment 'fastcgi_param COUPONSEIZE_USER_' <"$conf" >"$conf.new" && mv "$conf.new" "$conf"
    check_eq "nginx: the snippet's identity lines (3 locations x 2)" 6 \
        "$(grep -Ec "^[[:space:]]*fastcgi_param COUPONSEIZE_USER_(ID $FORCED|ROLE user);" "$conf")"
    kill -HUP "$COUPON_NGINX_PID"
    URLS[nginx]=$COUPON_URL
else
    ok "nginx # SKIP nginx is not installed"
fi

if [[ -n $LIGHTTPD ]]; then
    d=$WS/lighttpd
    mkdir -p "$d/logs" "$d/htdocs" "$d/errors"
    cp "$top_srcdir"/etc/lighttpd/errors/*.html "$d/errors/"
    snippet etc/lighttpd/couponseize.conf |
        sed "s|\"/usr/share/couponseize/errors/|\"$d/errors/|" |
        uncomment 'setenv.set-environment' >"$d/couponseize.conf"
    check_eq "lighttpd: the snippet's identity line" 1 \
        "$(grep -c "^setenv.set-environment = ( \"COUPONSEIZE_USER_ID\" => \"$FORCED\"" "$d/couponseize.conf")"
    port=$(free_port) || port=""
    {
        echo "server.document-root = \"$d/htdocs\""
        echo "server.bind = \"127.0.0.1\""
        echo "server.port = ${port:-1}"
        echo "server.errorlog = \"$d/logs/error.log\""
        if [[ -n $WEB_USER ]]; then
            echo "server.username = \"$WEB_USER\""
            echo "server.groupname = \"$WEB_GROUP\""
        fi
        echo "include \"$d/couponseize.conf\""
    } >"$d/lighttpd.conf"
    [[ -n $WEB_USER ]] && chown -R "$WEB_USER:$WEB_GROUP" "$d/logs"
    if [[ -n $port ]] && launch_server lighttpd "$port" "$LIGHTTPD" -D -f "$d/lighttpd.conf"; then
        URLS[lighttpd]=http://127.0.0.1:$port
    fi
else
    ok "lighttpd # SKIP lighttpd is not installed"
fi

if [[ -z $APACHE || -z $APACHE_MODDIR ]]; then
    ok "apache2 # SKIP apache2 or mod_proxy_fcgi is not installed"
else
    d=$WS/apache2
    mkdir -p "$d/logs" "$d/run" "$d/htdocs"
    snippet etc/apache2/couponseize.conf | uncomment 'SetEnv COUPONSEIZE_USER_' >"$d/couponseize.conf"
    check_eq "apache2: the snippet's identity lines" 2 \
        "$(grep -Ec "^[[:space:]]*SetEnv COUPONSEIZE_USER_(ID $FORCED|ROLE user)\$" "$d/couponseize.conf")"
    port=$(free_port) || port=""
    builtin=$("$APACHE" -l 2>/dev/null)
    {
        for m in mpm_event unixd log_config authz_core authz_host proxy proxy_fcgi headers \
            alias mime dir env; do
            [[ $builtin == *"mod_$m.c"* ]] && continue
            echo "LoadModule ${m}_module $APACHE_MODDIR/mod_$m.so"
        done
        cat <<EOF
ServerRoot "$d"
DefaultRuntimeDir "$d/run"
PidFile "$d/run/httpd.pid"
Listen 127.0.0.1:${port:-1}
ServerName localhost
TypesConfig /dev/null
DocumentRoot "$d/htdocs"
ErrorLog "$d/logs/error.log"
LogLevel warn
StartServers 1
ServerLimit 2
ThreadsPerChild 8
MaxRequestWorkers 16
MinSpareThreads 4
MaxSpareThreads 12
EOF
        if [[ -n $WEB_USER ]]; then
            echo "User $WEB_USER"
            echo "Group $WEB_GROUP"
        fi
        echo "Include \"$d/couponseize.conf\""
    } >"$d/httpd.conf"
    if [[ -n $port ]] &&
        launch_server apache2 "$port" "$APACHE" -f "$d/httpd.conf" -d "$d" -DFOREGROUND; then
        URLS[apache2]=http://127.0.0.1:$port
    fi
fi

# --- checks ----------------------------------------------------------------------

# ask URL METHOD PATH [BODY] [HEADER...]: HTTP_CODE and HTTP_BODY of a request
# carrying the given extra headers.
ask() {
    local url=$1 method=$2 path=$3 body=${4:-} out
    shift 4
    local -a args=(-s -X "$method" --max-time 10)
    if [[ -n $body ]]; then
        args+=(-H 'Content-Type: application/json' --data-binary "$body")
    elif [[ $method == POST ]]; then
        args+=(-H 'Content-Length: 0')
    fi
    local h
    for h in "$@"; do args+=(-H "$h"); done
    out=$(curl "${args[@]}" -w '\n%{http_code}' "$url$path") || true
    HTTP_CODE=${out##*$'\n'}
    HTTP_BODY=${out%$'\n'*}
}
code_of() { json_get "$HTTP_BODY" code 2>/dev/null; }

# fcgi_admin METHOD PATH: the app's answer to a request straight on its
# socket with COUPONSEIZE_USER_ROLE=admin (what a server that authenticated an
# operator sends).
fcgi_admin() {
    env -i REQUEST_METHOD="$1" REQUEST_URI="$2" QUERY_STRING="${2#*\?}" CONTENT_LENGTH=0 \
        SERVER_PROTOCOL=HTTP/1.1 GATEWAY_INTERFACE=CGI/1.1 REMOTE_ADDR=127.0.0.1 \
        COUPONSEIZE_USER_ID=1 COUPONSEIZE_USER_ROLE=admin \
        timeout 5 cgi-fcgi -bind -connect "$COUPON_FCGI_SOCK" 2>/dev/null | tr -d '\r'
}

forced_in_effect() {
    ask "$1" GET "/market/consumer/coupon/status?id=$2" ''
    [[ $HTTP_CODE == 200 && $HTTP_BODY == *'"mine"'* ]]
}

# One activity per server, so that user 42 can seize once through each.
declare -A ACTS=([nginx]=601 [lighttpd]=602 [apache2]=603)
for s in nginx lighttpd apache2; do
    mk_activity "${ACTS[$s]}" 100 -60 3600 || echo "Bail out! mk_activity failed"
done
out=$(fcgi_admin POST /market/admin/coupon/preheat)
check_match "the role param makes an admin (preheat straight on the socket)" '"code":"OK"' "$out"
out=$(env -i REQUEST_METHOD=POST REQUEST_URI=/market/admin/coupon/preheat CONTENT_LENGTH=0 \
    SERVER_PROTOCOL=HTTP/1.1 REMOTE_ADDR=127.0.0.1 HTTP_X_USER_ID=1 HTTP_X_USER_ROLE=admin \
    timeout 5 cgi-fcgi -bind -connect "$COUPON_FCGI_SOCK" 2>/dev/null | tr -d '\r')
check_match "X-User-Id and X-User-Role alone identify no one" '"code":"UNAUTHORIZED"' "$out"

SEIZE=/market/consumer/coupon/seize
for s in nginx lighttpd apache2; do
    url=${URLS[$s]:-}
    [[ -n $url ]] || continue
    act=${ACTS[$s]}
    list="COUPON:SEIZE:LIST:${act}_{$((act % 10))}"
    check "$s: the forced caller is in effect" wait_for 10 forced_in_effect "$url" "$act"

    first=1
    for h in X-User-Id X_User_Id X.User.Id; do
        ask "$url" POST "$SEIZE" "{\"id\":$act}" "$h: $CLAIMED"
        if ((first)); then
            check_eq "$s: seize with '$h: $CLAIMED' is user $FORCED's" "200 SEIZED" "$HTTP_CODE $(code_of)"
        else
            check_eq "$s: seize with '$h: $CLAIMED' is user $FORCED's again" \
                "409 ALREADY_SEIZED" "$HTTP_CODE $(code_of)"
        fi
        first=0
    done
    ask "$url" POST "$SEIZE" "{\"id\":$act}" "X_User_Id: $CLAIMED" "X.User.Id: $CLAIMED" \
        "X-User-Id: $CLAIMED"
    check_eq "$s: seize with all three spellings at once" "409 ALREADY_SEIZED" "$HTTP_CODE $(code_of)"
    check_eq "$s: the seize list holds user $FORCED only" "$FORCED" "$(rcli HKEYS "$list" | sort | tr '\n' ' ' | sed 's/ $//')"

    for h in X-User-Role X_User_Role X.User.Role; do
        ask "$url" GET "/market/admin/coupon/activity?id=$act" '' "$h: admin"
        check_eq "$s: admin route with '$h: admin'" "403 FORBIDDEN" "$HTTP_CODE $(code_of)"
    done
    ask "$url" GET "/market/admin/coupon/activity?id=$act" '' "X_User_Role: admin" \
        "X.User.Role: admin" "X-User-Role: admin" "X_User_Id: 1" "X-User-Id: 1"
    check_eq "$s: admin route with every spelling at once" "403 FORBIDDEN" "$HTTP_CODE $(code_of)"
done

# A server configured to pass the identity twice (in every location):
# refused, never picked from.
if [[ -n ${URLS[nginx]:-} ]]; then
    conf=$COUPON_DIR/nginx/couponseize.conf
    sed -E "s/fastcgi_param COUPONSEIZE_USER_ID $FORCED;/&\n    fastcgi_param COUPONSEIZE_USER_ID $CLAIMED;/" \
        "$conf" >"$conf.new" && mv "$conf.new" "$conf"
    kill -HUP "$COUPON_NGINX_PID"
    twice_refused() {
        ask "${URLS[nginx]}" POST "$SEIZE" "{\"id\":${ACTS[nginx]}}"
        [[ "$HTTP_CODE $(code_of)" == "401 UNAUTHORIZED" ]]
    }
    check "nginx: a user id param passed twice is refused (401)" wait_for 10 twice_refused
fi

finish
