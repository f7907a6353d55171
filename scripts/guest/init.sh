#!/bin/sh
# /init of the interop guest (busybox sh, PID 1). Built into the initramfs by
# scripts/guest/build.sh; run.sh passes the settings on the kernel command
# line:
#   guest_ip=10.77.0.2/24   eth0's address (default 10.77.0.2/24)
#   guest_gw=ADDR           a default route (optional)
#   guest_siw=a=1,b=0       siw module parameters, e.g.
#                           mpa_crc_required=1,peer_to_peer=1,mpa_version=1
#   guest_siwlo=1           also siw_lo on the loopback device
#   guest_9p=1              mount the host's SHARE directory (9p tag
#                           "hostshare") at /mnt/host
#   guest_shell=1           a shell on the serial console after the job
# The job is /mnt/host/guest.sh (with guest_9p=1) or else /etc/guest/job.sh
# (run.sh appends it as a second cpio archive). After it the guest powers
# off; without a job it opens a shell.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs shm /dev/shm
mount -t tmpfs tmp /tmp
# The kernel loads modules on demand (crypto shashes, rdma netlink) through
# this helper.
echo /sbin/modprobe >/proc/sys/kernel/modprobe

ip_addr=10.77.0.2/24
gw=""
siw_params=""
siwlo=0
ninep=0
shell=0
read -r cmdline </proc/cmdline
# shellcheck disable=SC2086 # one word per parameter
for arg in $cmdline; do
    case "$arg" in
    guest_ip=*) ip_addr=${arg#*=} ;;
    guest_gw=*) gw=${arg#*=} ;;
    guest_siw=*) siw_params=$(echo "${arg#*=}" | tr , ' ') ;;
    guest_siwlo=*) siwlo=${arg#*=} ;;
    guest_9p=*) ninep=${arg#*=} ;;
    guest_shell=*) shell=${arg#*=} ;;
    esac
done
uptime_s() { cut -d' ' -f1 /proc/uptime; }
say() { echo "guest: $*"; }

say "kernel $(uname -r), up $(uptime_s)s"
modprobe virtio_pci
modprobe virtio_net
# siw's MPA CRC is crc32c: the SSE4.2 one where the CPU has it.
modprobe crc32c_intel 2>/dev/null || modprobe crc32c_generic
# shellcheck disable=SC2086 # one word per parameter
modprobe siw $siw_params || say "FAILED: modprobe siw $siw_params"
modprobe rdma_ucm
modprobe ib_uverbs

ip link set lo up
n=0
while [ ! -e /sys/class/net/eth0 ] && [ $n -lt 100 ]; do
    sleep 0.1
    n=$((n + 1))
done
ip addr add "$ip_addr" dev eth0
ip link set eth0 up
[ -z "$gw" ] || ip route add default via "$gw"
rdma link add siw0 type siw netdev eth0 || say "FAILED: rdma link add siw0"
[ "$siwlo" != 1 ] || rdma link add siw_lo type siw netdev lo || say "FAILED: rdma link add siw_lo"
if [ "$ninep" = 1 ]; then
    modprobe 9pnet_virtio
    modprobe 9p
    mkdir -p /mnt/host
    mount -t 9p -o trans=virtio,version=9p2000.L hostshare /mnt/host || say "FAILED: mounting the 9p share"
fi
params=""
for p in /sys/module/siw/parameters/*; do
    [ -e "$p" ] && params="$params ${p##*/}=$(cat "$p")"
done
say "siw parameters:$params"
rdma link show
say "ready at $(uptime_s)s"

job=
[ -f /etc/guest/job.sh ] && job=/etc/guest/job.sh
[ "$ninep" = 1 ] && [ -f /mnt/host/guest.sh ] && job=/mnt/host/guest.sh
if [ -n "$job" ]; then
    say "running $job"
    sh "$job"
    say "job exit status $?"
fi
if [ "$shell" = 1 ] || [ -z "$job" ]; then
    setsid cttyhack sh -l
fi
say "powering off at $(uptime_s)s"
sync
poweroff -f
