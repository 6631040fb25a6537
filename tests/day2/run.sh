#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# make test-day2: a lab of its own (LAB_NAME pnd2ci, spare node c3), the day-2 tests
# (tests/day2), the lab down again. PODNET_DAY2_KEEP=1 keeps the lab up afterwards.
# c3 is a Slurm dynamic node (LAB_DYNAMIC_NODES) that the first deployment leaves out: the
# tests add it with scale.yml, then reset and remove it.
# The lab is first deployed with an older podnet, version A: the git revision
# PODNET_DAY2_FROM (default below, empty: deploy this checkout and skip the A -> B test),
# built and deployed from its own sources (its playbooks, roles, inventory variables and
# artifacts, as it was released) on a Slurm that this checkout's slurm.yml set up (Slurm is
# the site's: upgrades leave it alone); tests/day2/test_upgrade.py upgrades it to this
# checkout (B) with upgrade.yml while a job and an SSH session run; the other tests then run
# on B.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export LAB_NAME=${PODNET_DAY2_LAB:-pnd2ci}
# not in 203.0.113.0/25: that is the lab's Flannel network inside the nodes (upgrade.yml deploys it)
export LAB_SUBNET=${PODNET_DAY2_SUBNET:-198.51.100.176/28}
export LAB_NODES="ctl login c1 c2 c3"
export LAB_DYNAMIC_NODES=c3
# no Prometheus on this lab (the molecule lab tests it): its runs are the playbooks' own
export LAB_PROMETHEUS=0
export PODNET_DAY2_LAB=$LAB_NAME
LAB=$ROOT/tests/lab/lab.sh
mkdir -p "$ROOT/tests/output"
t0=$SECONDS
down() { [ "${PODNET_DAY2_KEEP:-0}" = 1 ] || "$LAB" down; }
trap down EXIT
"$LAB" down >/dev/null 2>&1 || true
"$LAB" up
# version A: 2026-11-23's main (before gateways, Flannel, prebuilt native code, the egress
# route and the day-2 playbooks; SPANK plugin and PAM module compiled on the nodes)
FROM=${PODNET_DAY2_FROM-6495445b140d45c09430aa3abc2c3cc828f2d242}
log=$ROOT/tests/output/day2-$LAB_NAME-site.log
if [ -n "$FROM" ]; then
    A=$ROOT/build/day2-from/$(git -C "$ROOT" rev-parse --short=12 "$FROM^{commit}")
    if [ ! -e "$A/.extracted" ]; then
        rm -rf "$A" && mkdir -p "$A"
        git -C "$ROOT" archive "$FROM" | tar -x -C "$A"
        touch "$A/.extracted"
    fi
    # A's artifacts in a cache of their own (its Go caches shared): A names its CoreDNS as
    # this checkout does (coredns-<version>-linux-amd64) but builds it otherwise, and one
    # file for both would swap the binary under the other suites (their idempotence) and
    # make the upgrade deploy A's CoreDNS. PODNET_CACHE_DIR on the command line: A's
    # Makefile exports its own.
    a_cache=${PODNET_CACHE_DIR:-/var/cache/podnet-dev}
    a_env=(PODNET_CACHE_DIR="$a_cache/day2-from")
    echo "day2: version A ($FROM): artifacts in $a_cache/day2-from (log $log)"
    GOMODCACHE=$a_cache/go/mod GOCACHE=$a_cache/go/build \
        make -C "$A" --no-print-directory artifacts collection-link "${a_env[@]}" >"$log" 2>&1 \
        || { tail -n 60 "$log"; exit 1; }
    cp "$("$LAB" inventory)" "$A/inventories/lab/hosts.yml"
    echo "day2: Slurm (this checkout's slurm.yml), without c3"
    ansible-playbook -i "$("$LAB" inventory)" "$ROOT/playbooks/slurm.yml" --limit 'all:!c3' \
        >>"$log" 2>&1 || { tail -n 60 "$log"; exit 1; }
    echo "day2: version A: preflight, etcd, dns, podnet, apptainer, without c3"
    # A's own Makefile environment (venv, ANSIBLE_CONFIG, its wheelhouse) around its playbooks
    (cd "$A" && make --no-print-directory -s -f Makefile -f - day2-deploy-a "${a_env[@]}" <<'MK'
day2-deploy-a:
	ansible-playbook -i $(ROOT)/inventories/lab/hosts.yml --limit 'all:!c3' \
	  $(addprefix $(ROOT)/playbooks/,preflight.yml etcd.yml dns.yml podnet.yml apptainer.yml)
MK
    ) >>"$log" 2>&1 || { tail -n 60 "$log"; exit 1; }
    export PODNET_DAY2_VERSION_A=$FROM
else
    echo "day2: site.yml without c3 (log $log)"
    ansible-playbook -i "$("$LAB" inventory)" "$ROOT/playbooks/site.yml" --limit 'all:!c3' >"$log" 2>&1 \
        || { tail -n 60 "$log"; exit 1; }
fi
echo "day2: lab deployed in $((SECONDS - t0)) s"
if [ -n "$FROM" ]; then
    # its own session: the workload that lives through the upgrade is started on A
    python -m pytest -q -s -p no:cacheprovider "$ROOT/tests/day2/test_upgrade.py"
fi
python -m pytest -q -s -p no:cacheprovider --ignore "$ROOT/tests/day2/test_upgrade.py" "$ROOT/tests/day2"
echo "day2: total $((SECONDS - t0)) s"
