#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# podnet slurm role: wait until the given Slurm nodes are usable.
# Usage: wait_nodes.sh TIMEOUT_SECONDS NODE...
# A node that is DOWN (and responding) because it rebooted or stopped responding
# earlier, as happens on a freshly booted lab, is resumed with scontrol.
# Prints "resumed: <nodes>" on the last line; exits 1 with the pending nodes on timeout.
set -u
timeout=$1
shift
deadline=$(($(date +%s) + timeout))
resumed=""
while :; do
	pending=""
	for node in "$@"; do
		line=$(sinfo -h -N -n "$node" -o '%T|%E' 2>/dev/null | head -n 1)
		state=${line%%|*}
		reason=${line#*|}
		case $state in
		idle | mixed | allocated | completing | planned | reserved | drained | draining)
			# settled (a drain is the administrator's decision)
			;;
		down)
			case $reason in
			*"unexpectedly rebooted"* | *"Not responding"* | *"Prolog error"* | *"Kill task failed"* | none)
				if scontrol update nodename="$node" state=resume; then
					case " $resumed " in
					*" $node "*) ;;
					*) resumed="$resumed $node" ;;
					esac
				fi
				;;
			esac
			pending="$pending $node=$state($reason)"
			;;
		*)
			pending="$pending $node=${state:-unknown}"
			;;
		esac
	done
	if [ -z "$pending" ]; then
		echo "resumed:$resumed"
		exit 0
	fi
	if [ "$(date +%s)" -ge "$deadline" ]; then
		echo "Slurm nodes not usable after ${timeout}s:$pending (resumed:$resumed)" >&2
		exit 1
	fi
	sleep 2
done
