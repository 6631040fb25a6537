#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Remove podnet's kernel state on this node (role hpc.podnet.reset, playbooks/reset.yml): pod network namespaces,
# the pods' PID 1 (podnet-init, which ends every process of the pod), PID namespace
# files, podnet's links (pnbr<vni>, pnvx<vni>, pnv<hex>; flanneld's flannel.1), its
# nftables tables (the fast path's netdev podnet and the gateway's inet podnet_gw
# included) and the pods' resolv.conf directories. Prints one line per thing removed
# (nothing: no change).
#   podnet-reset-kernel.sh NETNS_DIR PIDNS_DIR RESOLV_DIR PID_INIT
set -u
netns_dir=${1:-/run/netns}
pidns_dir=${2:-/run/podnet/pidns}
resolv_dir=${3:-/etc/netns}
pid_init=${4:-/usr/local/lib/podnet/podnet-init}

for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    case $exe in
        "$pid_init" | "$pid_init (deleted)")
            kill -KILL "${p#/proc/}" 2>/dev/null && echo "process ${p#/proc/} ($pid_init)" ;;
    esac
done
for f in "$pidns_dir"/*; do
    [ -e "$f" ] || continue
    umount "$f" 2>/dev/null
    rm -f "$f" && echo "pidns $f"
done
for f in "$netns_dir"/pn-*; do
    [ -e "$f" ] || continue
    name=${f##*/}
    if [ "$netns_dir" = /run/netns ]; then
        ip netns delete "$name" 2>/dev/null || { umount "$f" 2>/dev/null; rm -f "$f"; }
    else
        umount "$f" 2>/dev/null; rm -f "$f"
    fi
    echo "netns $name"
done
for l in $(ip -o link show | sed -n 's/^[0-9]*: \([^:@]*\)[:@].*/\1/p'); do
    case $l in
        pnbr[0-9]* | pnvx[0-9]* | pnv[0-9a-f]* | flannel.1)
            ip link delete "$l" 2>/dev/null && echo "link $l" ;;
    esac
done
for t in "inet podnet" "bridge podnet" "netdev podnet" "netdev podnet_probe" "inet podnet_gw"; do
    # shellcheck disable=SC2086
    if nft list table $t >/dev/null 2>&1; then
        # shellcheck disable=SC2086
        nft delete table $t && echo "nftables table $t"
    fi
done
for d in "$resolv_dir"/pn-*; do
    [ -e "$d" ] || continue
    rm -rf "$d" && echo "resolv $d"
done
exit 0
