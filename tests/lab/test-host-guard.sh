#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Proves the lab host's nftables table (lab.sh ruleset) on a throwaway copy of
# the lab topology, entirely inside network namespaces this script creates:
#
#   n1, n2 (lab nodes) --- <lab>br0 in "host" --- out (another network)
#   x1 (the gateway lab's external network, LAB_GATEWAYS=1) --- <lab>bx0 in "host"
#
# The "host" namespace has ip_forward=1 (in that namespace only; the real host
# is never touched), so without the table it WOULD route lab <-> out. With the
# table: lab -> out and out -> lab are dropped, node <-> node across the
# bridge and node <-> host still work. Addresses: 203.0.113.0/24 only.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ "$(id -u)" = 0 ] || { echo "test-host-guard: run as root" >&2; exit 1; }
P=pnlg$$                      # unique prefix of every namespace and link
P=${P:0:12}
BR=${P}br0 BX=${P}bx0
H=$P-host N1=$P-n1 N2=$P-n2 O=$P-out X1=$P-x1
passed=0 failed=0 listeners=()

cleanup() {
    local ns pid
    for pid in "${listeners[@]}"; do kill "$pid" 2>/dev/null || true; done
    for ns in "$H" "$N1" "$N2" "$O" "$X1"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT
[ -z "${GUARD_DEBUG:-}" ] || trap - EXIT

check() {   # check NAME EXPECT(ok|fail) CMD...
    local name=$1 expect=$2 got
    shift 2
    if "$@" >/dev/null 2>&1; then got=ok; else got=fail; fi
    if [ "$got" = "$expect" ]; then
        echo "PASS $name"; passed=$((passed + 1))
    else
        echo "FAIL $name (expected $expect, got $got)"; failed=$((failed + 1))
    fi
}
# reach SRC_NS IP: TCP connect from SRC_NS to IP:7777 within 1 s
reach() { ip netns exec "$1" timeout 1 bash -c "exec 3<>/dev/tcp/$2/7777"; }
listen() {   # a TCP listener on port 7777 in namespace $1
    ip netns exec "$1" /usr/bin/python3 -c 'import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7777))
s.listen(16)
while True:
    s.accept()[0].close()' &
    listeners+=($!)
}

for ns in "$H" "$N1" "$N2" "$O" "$X1"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
done
ip netns exec "$H" sysctl -qw net.ipv4.ip_forward=1
ip netns exec "$H" sysctl -qw net.bridge.bridge-nf-call-iptables=1
ip -n "$H" link add "$BR" type bridge
ip -n "$H" addr add 203.0.113.65/26 dev "$BR"
ip -n "$H" link set "$BR" up
i=1
for ns in "$N1" "$N2"; do
    ip link add "$P-v$i" netns "$H" type veth peer name host0 netns "$ns"
    ip -n "$H" link set "$P-v$i" master "$BR" up
    ip -n "$ns" addr add "203.0.113.7$i/26" dev host0
    ip -n "$ns" link set host0 up
    ip -n "$ns" route add default via 203.0.113.65
    i=$((i + 1))
done
ip link add "$P-vo" netns "$H" type veth peer name eth0 netns "$O"
ip -n "$H" addr add 203.0.113.129/30 dev "$P-vo"
ip -n "$H" link set "$P-vo" up
ip -n "$O" addr add 203.0.113.130/30 dev eth0
ip -n "$O" link set eth0 up
ip -n "$O" route add default via 203.0.113.129
ip -n "$H" link add "$BX" type bridge
ip -n "$H" addr add 203.0.113.193/27 dev "$BX"
ip -n "$H" link set "$BX" up
ip link add "$P-vx" netns "$H" type veth peer name host0 netns "$X1"
ip -n "$H" link set "$P-vx" master "$BX" up
ip -n "$X1" addr add 203.0.113.212/27 dev host0
ip -n "$X1" link set host0 up
ip -n "$X1" route add default via 203.0.113.193
for ns in "$H" "$N2" "$O" "$N1" "$X1"; do listen "$ns"; done
for ns in "$H" "$N2" "$O" "$N1" "$X1"; do
    for _ in $(seq 50); do reach "$ns" 127.0.0.1 2>/dev/null && break; sleep 0.1; done
done

# Without the table the "host" forwards: the guard is what stops it.
check "no table: lab node -> other network is routed (baseline)" ok reach "$N1" 203.0.113.130

LAB_NAME=$P LAB_SUBNET=203.0.113.64/26 "$here/lab.sh" ruleset | ip netns exec "$H" nft -f -
check "table: node -> node across the lab bridge" ok reach "$N1" 203.0.113.72
check "table: node -> host bridge address" ok reach "$N1" 203.0.113.65
check "table: lab node -> other network is dropped" fail reach "$N1" 203.0.113.130
check "table: other network -> lab node is dropped" fail reach "$O" 203.0.113.71
check "table: external network -> host bridge address" ok reach "$X1" 203.0.113.193
check "table: external network -> lab node is dropped" fail reach "$X1" 203.0.113.71
check "table: lab node -> external network is dropped" fail reach "$N1" 203.0.113.212
check "table: external network -> other network is dropped" fail reach "$X1" 203.0.113.130
rules=$(ip netns exec "$H" nft list table inet "${P}_host")
check "table: bridged node <-> node frames passed the forward hook (accept counter)" ok \
    grep -Eq 'oifname "'"$BR"'" counter packets [1-9][0-9]* bytes [0-9]+ accept' <<<"$rules"
check "table: drop counters moved" ok grep -Eq 'counter packets [1-9][0-9]* bytes [0-9]+ drop' <<<"$rules"
# Re-applying (every lab.sh up does) replaces the table atomically.
LAB_NAME=$P LAB_SUBNET=203.0.113.64/26 "$here/lab.sh" ruleset | ip netns exec "$H" nft -f -
check "table: re-applied, still dropping" fail reach "$N2" 203.0.113.130
check "table: one table after re-apply" ok test "$(ip netns exec "$H" nft list tables | grep -c "${P}_host")" = 1

echo "host-guard: $passed passed, $failed failed"
[ "$failed" = 0 ]
