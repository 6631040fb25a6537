#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# podnet preflight: probe kernel features in a throwaway network namespace.
# Usage: kernel_probe.sh FEATURE...   (veth, bridge, vxlan, nf_tables)
# Prints one line per feature: "<feature> ok" or "<feature> missing <why>".
# Everything is created inside a new network namespace that disappears when
# the probe exits: nothing is left on the host, whatever happens.
# Built-in or loaded modules do not always show in /sys/module (containers
# such as systemd-nspawn nodes have no /sys/module at all), so the probe
# creates the objects instead of looking for modules.
set -u
for tool in unshare ip; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		for f in "$@"; do echo "$f missing the '$tool' command is not installed (util-linux / iproute2)"; done
		exit 0
	fi
done
exec unshare --net /bin/sh -s "$@" <<'PROBE'
report() {
	feature=$1; shift
	if out=$("$@" 2>&1); then
		echo "$feature ok"
	else
		echo "$feature missing $(echo "$out" | tr '\n' ' ')"
	fi
}
nf_tables_netlink() {
	# No nft command yet (podnet installs nftables after preflight): ask nf_tables for its
	# generation over netlink, with the python3 Ansible runs on (the kernel loads the module
	# when it is not loaded yet, as for nft)
	python3 - <<'PY'
import socket
import struct
import sys

try:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)  # NETLINK_NETFILTER
    # nlmsghdr (NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETGEN, NLM_F_REQUEST | NLM_F_ACK), nfgenmsg
    s.send(struct.pack("=IHHII", 20, (10 << 8) | 16, 1 | 4, 1, 0) + struct.pack("=BBH", 0, 0, 0))
    data = s.recv(65536)
except OSError as e:
    sys.exit(f"no nfnetlink: {e}")
err = struct.unpack_from("=i", data, 16)[0] if len(data) >= 20 else 0
if struct.unpack_from("=H", data, 4)[0] == 2 and err != 0:  # NLMSG_ERROR
    sys.exit(f"nf_tables does not answer (errno {-err})")
PY
}
for feature in "$@"; do
	case $feature in
	veth) report veth ip link add pfpva type veth peer name pfpvb ;;
	bridge) report bridge ip link add pfpbr type bridge ;;
	vxlan) report vxlan ip link add pfpvx type vxlan id 4242 dstport 4789 ;;
	nf_tables)
		if command -v nft >/dev/null 2>&1; then
			report nf_tables nft add table inet pfprobe
		else
			report nf_tables nf_tables_netlink
		fi ;;
	*) echo "$feature missing unknown feature (the probe knows veth, bridge, vxlan, nf_tables)" ;;
	esac
done
PROBE
