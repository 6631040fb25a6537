#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# lab.sh summary: which podnet-stack services run on each node.
set -uo pipefail
for n in $LAB_NODES; do
    units=$("$LAB_SH" ssh "$n" "systemctl list-units --no-legend --plain --state=active --type=service \
        'munge*' 'slurm*' 'etcd*' 'coredns*' 'podnet*' 'flannel*' | awk '{ printf \"%s \", \$1 }'" 2>/dev/null)
    printf 'services %-7s %s\n' "$n:" "${units:-none of munge/slurm/etcd/coredns/podnet/flannel}"
done
