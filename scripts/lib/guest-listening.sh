# shellcheck shell=sh
# Guest-side shell (busybox sh) for the QEMU guest jobs of the test
# scripts: a job script that starts a server in the guest and then lets a
# client (in the guest or on the host) connect uses `listening PORT` to
# wait until the server really listens, instead of a fixed sleep that an
# emulated (TCG) guest on a slower host can outlast. Linux siw's rdma_cm
# listeners are kernel TCP sockets, so they show in /proc/net/tcp as
# plain TCP listeners do; rxe's show only as LISTEN cm ids (`rdma res
# show cm_id`). Cat this file into the job before its use.

# listening PORT [TENTHS]: wait up to TENTHS tenths of a second (default
# 300) until a TCP socket of this guest listens on PORT; 1 if none did.
listening() {
  _lp=$(printf '%04X' "$1")
  _li=0
  while [ "$_li" -lt "${2:-300}" ]; do
    if grep -qE "^ *[0-9]+: [0-9A-F]+:$_lp [0-9A-F]+:0000 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
      return 0
    fi
    # RoCE (rxe) listens through the IB CM, with no TCP socket: its
    # listening rdma_cm ids are in the kernel's resource table.
    if rdma res show cm_id 2>/dev/null | grep -qE "state LISTEN .*src-addr [^ ]*:$1( |\$)"; then
      return 0
    fi
    sleep 0.1
    _li=$((_li + 1))
  done
  echo "listening: nothing listens on port $1 after $((${2:-300} / 10)) s" >&2
  return 1
}
