#!/bin/bash
# events.sh DIR: the milestones of one get's capture (client ns a), in ms and in RTTs (RTT = SYN to SYN-ACK)
tshark -r "$1/cap.pcap" -T fields -e frame.time_relative -e ip.src -e tcp.srcport -e tcp.dstport -e tcp.flags.str -e tcp.len 2>/dev/null | awk '
function ev(name, t) { printf "  %-44s %8.1f ms  %5.2f RTT\n", name, t*1000, t/rtt }
NR==1 {t0=$1}
$5 ~ /A··S/ && !rtt {rtt=$1-t0}
$3==24021 && $6>0 && !banner {banner=$1}
$4==24021 && $6>0 && !login {login=$1}
$4==24021 && $6>0 && login && $1>login+0.001 && !second {second=$1}
$5 ~ /^··········S·$/ && $4!=24021 && !mpa {mpa=$1}
$2 ~ /\.2$/ && $3!=24021 && $6>=48 && $6<=60 && !rep {rep=$1}
$2 ~ /\.1$/ && $4!=24021 && $6>200 && $6<2000 && !grant {grant=$1}
$6>1000 && $2 ~ /\.2$/ && !first {first=$1}
$6>1000 && $2 ~ /\.2$/ {last=$1}
$2 ~ /\.1$/ && $5 ~ /F/ {cfin=$1}
$2 ~ /\.2$/ && $5 ~ /F/ {sfin=$1}
END {
  printf "  RTT (handshake) %.1f ms\n", rtt*1000
  ev("greeting arrives", banner); ev("login flight sent", login); ev("second control flight sent", second)
  ev("session SYNs", mpa); ev("MPA Reply arrives", rep); ev("grants sent", grant); ev("first data segment", first)
  ev("last data segment", last); ev("client FINs (last)", cfin); ev("server FINs (last)", sfin)
}'
