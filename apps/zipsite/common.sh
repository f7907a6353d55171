# shellcheck shell=bash
# The zipsite's shared steps, sourced by scripts/test-zipsite.sh and
# scripts/bench-zipsite.sh (which set ROOT and T, a temp dir of mode 755):
#
#   zs_install            install what is missing (Debian packages)
#   zs_data [PICS]        generate the data set into ${ZS_DATA:-$T/data} (an
#                         existing complete one is reused with PICS=all) and
#                         the docroot $T/www (PICS: none, all or ids:FILE)
#   zs_pg_start           an unprivileged PostgreSQL cluster in $T/pg with its
#                         socket in $T/pgsock (no TCP listener), loaded
#   zs_pg_stop
#   zs_apache_conf NAME PORT DSN [RDMA]   write $T/NAME.conf; RDMA = path
#                         of mod_rdma.so (RDMA On for /pics; more directives
#                         in ZS_RDMA_CONF), or empty. ZS_CCACHE_IPC set: also
#                         mod_ccache on /near/N (the coherent cache's side)
#   zs_apache_start NAME PORT             start it; echoes the pid
#   zs_stop PID           TERM, wait (bounded), KILL
#
# PHP runs as Debian's mod_php (libapache2-mod-php), which needs the prefork
# MPM: so does mod_rdma, so both load into the same Apache.

ZS_DIR="$ROOT/apps/zipsite"
# shellcheck source=scripts/lib/apache.sh
. "$ROOT/scripts/lib/apache.sh"
ZS_PGBIN=""
ZS_PHPMOD=""

zs_log() { echo "zipsite: $*" >&2; }

zs_find() {
    ZS_PGBIN="$(find /usr/lib/postgresql -maxdepth 3 -name pg_ctl -path '*/bin/*' 2>/dev/null | sort -V | tail -1)"
    ZS_PGBIN="${ZS_PGBIN%/pg_ctl}"
    ZS_PHPMOD="$(find /usr/lib/apache2/modules -maxdepth 1 -name 'libphp*.so' 2>/dev/null | sort -V | tail -1)"
}

# Installs only what is missing: mod_php, PDO SQLite and PostgreSQL drivers,
# PostgreSQL, Apache. Returns 1 naming what could not be installed.
zs_install() {
    local need=()
    zs_find
    command -v apache2 >/dev/null || need+=(apache2)
    [ -n "$ZS_PHPMOD" ] || need+=(libapache2-mod-php)
    compgen -G "/etc/php/*/mods-available/pdo_sqlite.ini" >/dev/null || need+=(php-sqlite3)
    compgen -G "/etc/php/*/mods-available/pdo_pgsql.ini" >/dev/null || need+=(php-pgsql)
    [ -n "$ZS_PGBIN" ] || need+=(postgresql)
    command -v curl >/dev/null || need+=(curl)
    if [ "${#need[@]}" -gt 0 ]; then
        apt_install "${need[@]}"
        zs_find
    fi
    [ -n "$ZS_PHPMOD" ] || { zs_log "libapache2-mod-php is missing: apt-get install libapache2-mod-php"; return 1; }
    [ -n "$ZS_PGBIN" ] || { zs_log "PostgreSQL is missing: apt-get install postgresql"; return 1; }
    return 0
}

zs_data() { # [PICS]: the data set into ${ZS_DATA:-$T/data}, the docroot $T/www
    local pics="${1:-none}"
    ZS_DATA="${ZS_DATA:-$T/data}"
    mkdir -p "$ZS_DATA" "$T/www"
    if [ "$pics" = all ] && [ -f "$ZS_DATA/zipsite.db" ] && [ -f "$ZS_DATA/pics/42000.png" ]; then
        zs_log "reusing the data set in $ZS_DATA"
    else
        timeout 1200 python3 "$ZS_DIR/zipdata.py" --out "$ZS_DATA" --pictures "$pics" >&2 || return 1
    fi
    cp "$ZS_DIR"/site/*.php "$T/www/"
    ln -sfn "$ZS_DATA/pics" "$T/www/pics"
    chmod -R a+rX "$ZS_DATA" "$T/www"
}

ZS_PGSOCK=""
zs_pg_start() {
    local pg="$T/pg"
    ZS_PGSOCK="$T/pgsock"
    mkdir -p "$pg" "$ZS_PGSOCK"
    chown postgres: "$pg" "$ZS_PGSOCK" && chmod 700 "$pg" && chmod 755 "$ZS_PGSOCK" || return 1
    # The cluster runs as the unprivileged postgres user, with trust auth on
    # its own Unix socket only (listen_addresses '': no TCP port at all).
    runuser -u postgres -- "$ZS_PGBIN/initdb" -D "$pg/data" -U zipsite --auth=trust -E UTF8 --no-sync >"$T/pg-initdb.log" 2>&1 ||
        { cat "$T/pg-initdb.log" >&2; return 1; }
    runuser -u postgres -- "$ZS_PGBIN/pg_ctl" -D "$pg/data" -l "$pg/server.log" -w -t 60 \
        -o "-c listen_addresses='' -k $ZS_PGSOCK -c fsync=off -c max_connections=60" start >"$T/pg-start.log" 2>&1 ||
        { cat "$T/pg-start.log" "$pg/server.log" >&2; return 1; }
    timeout 60 psql -q -h "$ZS_PGSOCK" -U zipsite -d postgres -c 'CREATE DATABASE zipsite' >/dev/null &&
        timeout 120 psql -q -v ON_ERROR_STOP=1 -h "$ZS_PGSOCK" -U zipsite -d zipsite \
            -f "$ZS_DATA/schema.sql" \
            -c "\\copy place FROM '$ZS_DATA/places.csv' CSV" \
            -c "\\copy person FROM '$ZS_DATA/people.csv' CSV" \
            -c 'ANALYZE' >/dev/null
}
zs_pg_stop() {
    [ -n "$ZS_PGSOCK" ] && [ -d "$T/pg/data" ] || return 0
    runuser -u postgres -- "$ZS_PGBIN/pg_ctl" -D "$T/pg/data" -m fast -w -t 30 stop >/dev/null 2>&1
}
zs_pg_dsn() { echo "pgsql:host=$ZS_PGSOCK;dbname=zipsite"; }

zs_apache_conf() { # NAME PORT DSN [MOD_RDMA_SO]
    local name="$1" port="$2" dsn="$3" mod="${4:-}"
    mkdir -p "$T/$name"
    {
        apache_conf_head "$T/$name" "$T/$name" mime dir env
        apache_prefork "${ZS_WORKERS:-4}"
        cat <<EOF
Listen 127.0.0.1:$port
LogFormat "%h \"%r\" %>s %b %D" zs
CustomLog $T/$name/access.log zs
LoadModule php_module $ZS_PHPMOD
MaxConnectionsPerChild 0
KeepAlive On
KeepAliveTimeout 5
MaxKeepAliveRequests 0
TypesConfig /etc/mime.types
DocumentRoot $T/www
DirectoryIndex index.php
<Directory />
    Require all granted
</Directory>
<FilesMatch "\\.php\$">
    SetHandler application/x-httpd-php
</FilesMatch>
SetEnv ZIPSITE_DSN "$dsn"
SetEnv ZIPSITE_DB_USER zipsite
LogLevel warn
EOF
        if [ -n "${ZS_CCACHE_IPC:-}" ]; then
            # The coherent cache's application side (docs/CACHE.md): each
            # /near/N page is document N, served inside a Table 1 read.
            cat <<EOF
LoadModule alias_module /usr/lib/apache2/modules/mod_alias.so
LoadModule ccache_module $ROOT/tools/ccache/apache/.libs/mod_ccache.so
CCacheIPC $ZS_CCACHE_IPC
CCacheTimeout 10000
AliasMatch "^/near/([0-9]+)\$" "$T/www/nearplace.php"
<Location /near/>
    CCache On
</Location>
EOF
        fi
        if [ -n "$mod" ]; then
            cat <<EOF
LoadModule rdma_module $mod
RDMARegistration dynamic
${ZS_RDMA_CONF:-}
<Location /pics>
    RDMA On
</Location>
EOF
        fi
    } >"$T/$name.conf"
}

zs_apache_start() { # NAME PORT -> pid on stdout
    local name="$1" port="$2"
    APACHE_WAIT_S=15 apache_start "$T/$name.conf" "$port" "$T/$name/stdout.log" pics/ && return 0
    apache_logs "$T/$name/stdout.log" "$T/$name/error.log" >&2
    return 1
}

# zs_cache_start BACKEND_PORT PROXY_PORT: ccappd (documents 0..42000, no
# update thread) and ccproxy --mode rdma in front of the Apache on
# BACKEND_PORT, caching /near/N; ZS_CCACHE_IPC must have been set before
# that Apache's zs_apache_conf. Sets ZS_APPD_PID, ZS_PROXY_PID.
zs_cache_start() {
    local target="${CARGO_TARGET_DIR:-$ROOT/target}" p_rd p_ver
    [[ $target == /* ]] || target="$ROOT/$target"
    p_rd=$(free_port_once "$T/ports")
    p_ver=$(free_port_once "$T/ports")
    "$target/release/ccappd" --docs 42001 --rdma-listen "127.0.0.1:$p_rd" --version-listen "127.0.0.1:$p_ver" \
        --ipc "$ZS_CCACHE_IPC" --ipc-mode 660 --ipc-group www-data --token-file "$T/ccache-token" >>"$T/ccappd.log" 2>&1 &
    ZS_APPD_PID=$!
    zs_wait_port "$p_ver" "$ZS_APPD_PID" || { cat "$T/ccappd.log" >&2; return 1; }
    "$target/release/ccproxy" --mode rdma --listen "127.0.0.1:$2" --backend "127.0.0.1:$1" --prefix /near/ \
        --appd-rdma "127.0.0.1:$p_rd" --appd-tcp "127.0.0.1:$p_ver" --check-timeout-ms 2000 \
        --token-file "$T/ccache-token" >>"$T/ccproxy.log" 2>&1 &
    ZS_PROXY_PID=$!
    zs_wait_port "$2" "$ZS_PROXY_PID" || { cat "$T/ccproxy.log" >&2; return 1; }
}
zs_wait_port() { # PORT PID: until something accepts on PORT (at most 15 s) while PID lives
    for _ in $(seq 1 150); do
        python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.5).close()' "$1" 2>/dev/null && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

zs_stop() { apache_stop "$@"; } # PID...: TERM, wait (bounded), KILL
