# shellcheck shell=bash
# The coherent cache's topology on one machine (issue 13), sourced by
# scripts/bench-cache.sh and scripts/test-cache-topology.sh:
#
#   namespace ${TOPO}-br: bridge br0
#   ${TOPO}-cl   10.78.0.2     the load generator
#   ${TOPO}-p<i> 10.78.0.10+i  proxies (ccproxy in each mode; nginx on p0)
#   ${TOPO}-a<j> 10.78.0.20+j  application servers (apache2 + mod_ccache, ccappd)
#
# each joined to the bridge by a veth pair. Documents are sharded over the
# application servers (doc % APPS, ccproxy --shards). TOPO (default cc13b)
# names everything this creates, so two runs with different TOPO do not
# collide; topo_down removes exactly what topo_up made.
#
# Needs: root, iproute2, apache2 + apache2-dev (mod_ccache), the ccache
# binaries in $TARGET/release. The caller sets ROOT, T (a temp dir) and
# TARGET, and defines `say`.

TOPO="${TOPO:-cc13b}"
NET="${NET:-10.78.0}"
TOPO_PIDS=()

ns() { echo "${TOPO}-$1"; }
addr_of() { # cl | p<i> | a<j>
    case "$1" in
    cl) echo "$NET.2" ;;
    p*) echo "$NET.$((10 + ${1#p}))" ;;
    a*) echo "$NET.$((20 + ${1#a}))" ;;
    esac
}
in_ns() { local n="$1"; shift; ip netns exec "$(ns "$n")" "$@"; }

topo_down() {
    local p
    for p in "${TOPO_PIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null
    done
    for p in "${TOPO_PIDS[@]}"; do
        timeout 10 tail --pid="$p" -f /dev/null 2>/dev/null || kill -KILL "$p" 2>/dev/null
    done
    TOPO_PIDS=()
    local n
    for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${TOPO}-(br|cl|p[0-9]+|a[0-9]+)$"); do
        # Processes left in the namespace (apache children) go with it.
        local pids
        pids="$(ip netns pids "$n" 2>/dev/null)"
        if [ -n "$pids" ]; then
            # shellcheck disable=SC2086
            kill -KILL $pids 2>/dev/null
        fi
        ip netns del "$n" 2>/dev/null
    done
}

topo_node() { # name
    local n v
    n="$(ns "$1")"
    v="${TOPO}$1"
    ip netns add "$n" || return 1
    ip -n "$n" link set lo up
    ip link add "${v}" type veth peer name "${v}b" || return 1
    ip link set "${v}" netns "$n"
    ip link set "${v}b" netns "$(ns br)"
    ip -n "$n" link set "${v}" name eth0
    ip -n "$n" addr add "$(addr_of "$1")/24" dev eth0
    ip -n "$n" link set eth0 up
    ip -n "$(ns br)" link set "${v}b" master br0
    ip -n "$(ns br)" link set "${v}b" up
}

topo_up() { # proxies apps
    local i
    topo_down
    ip netns add "$(ns br)" || return 1
    ip -n "$(ns br)" link set lo up
    ip -n "$(ns br)" link add br0 type bridge
    ip -n "$(ns br)" link set br0 up
    topo_node cl || return 1
    for i in $(seq 0 $(($1 - 1))); do topo_node "p$i" || return 1; done
    for i in $(seq 0 $(($2 - 1))); do topo_node "a$i" || return 1; done
}

# wait_tcp NODE ADDR PORT PID: until ADDR:PORT accepts (10 s) while PID lives.
wait_tcp() {
    local _
    for _ in $(seq 1 100); do
        if in_ns "$1" /usr/bin/python3 -c 'import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 0.5).close()' "$2" "$3" 2>/dev/null; then
            return 0
        fi
        kill -0 "$4" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# start_app J DOCS COMPUTE [extra ccappd args...]: ccappd and apache2 in a<J>.
# Documents are in $T/a<J>/docs (created by the caller or --init-docs).
# APP_CPUS / FRONT_CPUS: pin the application tier / the client, proxies
# and nginx to these CPUs (taskset lists), so the compute threads load the
# application servers' CPUs the way they would on separate hosts.
PIN_APP=()
PIN_FRONT=()
if [ -n "${APP_CPUS:-}" ]; then PIN_APP=(taskset -c "$APP_CPUS"); fi
if [ -n "${FRONT_CPUS:-}" ]; then PIN_FRONT=(taskset -c "$FRONT_CPUS"); fi
# The deployment's access token, one for every ccappd and proxy (a proxy
# with --shards proves one token to every shard): made once, mode 0600.
topo_token() {
    [ -s "$T/token" ] && return 0
    (umask 077 && { od -An -tx1 -N32 /dev/urandom | tr -d ' \n'; echo; } >"$T/token")
}

start_appd() { # J DOCS COMPUTE [args...]
    local j="$1" docs="$2" compute="$3" a d
    shift 3
    topo_token || return 1
    a="$(addr_of "a$j")"
    d="$T/a$j"
    mkdir -p "$d/docs" "$d/run" "$d/logs"
    chmod 755 "$d" "$d/docs"
    in_ns "a$j" "${PIN_APP[@]}" "$TARGET/release/ccappd" --docs "$docs" --docroot "$d/docs" \
        --rdma-listen "$a:7471" --version-listen "$a:7472" --sockets-listen "$a:7473" \
        --ipc "$d/ipc.sock" --ipc-mode 660 --ipc-group www-data --token-file "$T/token" \
        --compute-threads "$compute" "$@" >>"$d/ccappd.log" 2>&1 &
    APPD_PID_LAST=$!
    TOPO_PIDS+=("$APPD_PID_LAST")
    wait_tcp "a$j" "$a" 7472 "$APPD_PID_LAST"
}

start_apache() { # J
    local j="$1" a d
    a="$(addr_of "a$j")"
    d="$T/a$j"
    mkdir -p "$d/docs" "$d/run" "$d/logs"
    cat >"$d/apache.conf" <<EOF
ServerRoot /etc/apache2
ServerName $a
Listen $a:80
DefaultRuntimeDir $d/run
PidFile $d/run/httpd.pid
ErrorLog $d/logs/error.log
LogLevel warn
User www-data
Group www-data
LoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
LoadModule alias_module /usr/lib/apache2/modules/mod_alias.so
LoadModule headers_module /usr/lib/apache2/modules/mod_headers.so
LoadModule ccache_module $ROOT/tools/ccache/apache/.libs/mod_ccache.so
StartServers 8
MinSpareServers 4
MaxSpareServers 16
ServerLimit 64
MaxRequestWorkers 64
KeepAlive On
MaxKeepAliveRequests 0
EnableSendfile On
DocumentRoot $d/docs
CCacheIPC $d/ipc.sock
CCacheTimeout 10000
Alias /docs/ $d/docs/
<Directory />
    Require all granted
</Directory>
<Location /docs/>
    CCache On
    # For nginx's proxy_cache: cache, but expired at once (an absolute
    # expiry in 1970), so every request is a conditional GET.
    Header always set X-Accel-Expires "@1"
</Location>
EOF
    # Own session: on shutdown prefork signals its whole process group.
    in_ns "a$j" setsid "${PIN_APP[@]}" apache2 -d /etc/apache2 -f "$d/apache.conf" -DFOREGROUND >>"$d/logs/stdout.log" 2>&1 &
    TOPO_PIDS+=("$!")
    # From the client's namespace: this also proves the bridge works.
    wait_tcp cl "$a" 80 "$!"
}

# write_shards APPS FILE: the shard map of ccproxy --shards.
write_shards() {
    local j a
    : >"$2"
    for j in $(seq 0 $(($1 - 1))); do
        a="$(addr_of "a$j")"
        echo "shard $j backend=$a:80 rdma=$a:7471 tcp=$a:7472 sockets=$a:7473" >>"$2"
    done
}

# start_proxy I MODE PORT SHARDS [args...]: ccproxy in p<I>.
start_proxy() {
    local i="$1" mode="$2" port="$3" shards="$4" a
    shift 4
    a="$(addr_of "p$i")"
    topo_token || return 1
    in_ns "p$i" "${PIN_FRONT[@]}" "$TARGET/release/ccproxy" --mode "$mode" --listen "$a:$port" \
        --shards "$shards" --prefix /docs/ --max-conns 1024 --token-file "$T/token" "$@" >>"$T/ccproxy-p$i-$mode.log" 2>&1 &
    PROXY_PID_LAST=$!
    TOPO_PIDS+=("$PROXY_PID_LAST")
    wait_tcp "p$i" "$a" "$port" "$PROXY_PID_LAST"
}

# start_nginx I PORT APPS DOCS: nginx proxy_cache in p<I>, revalidating
# every request (conditional GET), documents routed to their shard.
start_nginx() {
    local i="$1" port="$2" apps="$3" docs="$4" a d n
    a="$(addr_of "p$i")"
    d="$T/nginx-p$i"
    mkdir -p "$d/cache" "$d/tmp"
    {
        echo "worker_processes 1;"
        echo "pid $d/nginx.pid;"
        echo "error_log $d/error.log warn;"
        echo "events { worker_connections 4096; }"
        echo "http {"
        echo "  access_log off;"
        echo "  client_body_temp_path $d/tmp; proxy_temp_path $d/tmp; fastcgi_temp_path $d/tmp; uwsgi_temp_path $d/tmp; scgi_temp_path $d/tmp;"
        echo "  proxy_cache_path $d/cache levels=1 keys_zone=cc:16m max_size=1g;"
        echo "  keepalive_requests 1000000;"
        for n in $(seq 0 $((apps - 1))); do
            echo "  upstream a$n { server $(addr_of "a$n"):80; keepalive 64; }"
        done
        echo "  map \$uri \$shard {"
        echo "    default a0;"
        for n in $(seq 0 $((docs - 1))); do
            echo "    /docs/$n a$((n % apps));"
        done
        echo "  }"
        echo "  server {"
        echo "    listen $a:$port;"
        echo "    location /docs/ {"
        echo "      proxy_pass http://\$shard;"
        echo "      proxy_http_version 1.1;"
        echo "      proxy_set_header Connection \"\";"
        echo "      proxy_cache cc;"
        echo "      proxy_cache_revalidate on;"
        echo "      add_header X-Cache-Status \$upstream_cache_status always;"
        echo "    }"
        echo "  }"
        echo "}"
    } >"$d/nginx.conf"
    in_ns "p$i" "${PIN_FRONT[@]}" nginx -c "$d/nginx.conf" -g "daemon off;" >>"$d/stdout.log" 2>&1 &
    TOPO_PIDS+=("$!")
    wait_tcp "p$i" "$a" "$port" "$!"
}

# live_pids NAME: the processes in the node's namespace that are not zombies.
live_pids() {
    local p st
    for p in $(ip netns pids "$(ns "$1")" 2>/dev/null); do
        st="$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)"
        if [ -n "$st" ] && [ "$st" != Z ]; then echo "$p"; fi
    done
}

# kill_node NAME: SIGKILL every process in the node's namespace (a server
# that dies at once), again until none is left: a parent may fork a child
# between the listing and the kill.
kill_node() {
    local pids _
    for _ in $(seq 1 100); do
        pids="$(live_pids "$1")"
        [ -z "$pids" ] && return 0
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null
        sleep 0.1
    done
    echo "still alive in $(ns "$1"): $(live_pids "$1")"
    return 1
}
