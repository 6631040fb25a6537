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
nf_tables_fallback() {
	# No nft command: look for the module (loaded, built in or loadable).
	rel=$(uname -r)
	grep -qs '^nf_tables ' /proc/modules && return 0
	[ -d /sys/module/nf_tables ] && return 0
	grep -qs '/nf_tables.ko' "/lib/modules/$rel/modules.builtin" "/lib/modules/$rel/modules.dep" && return 0
	echo "nft is not installed and no nf_tables module was found (install nftables to probe)"
	return 1
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
			report nf_tables nf_tables_fallback
		fi ;;
	*) echo "$feature missing unknown feature (the probe knows veth, bridge, vxlan, nf_tables)" ;;
	esac
done
PROBE
