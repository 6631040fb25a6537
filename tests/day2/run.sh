#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# make test-day2: a lab of its own (LAB_NAME pnd2ci, spare node c3), site.yml, the day-2
# tests (tests/day2), the lab down again. PODNET_DAY2_KEEP=1 keeps the lab up afterwards.
# c3 is a Slurm dynamic node (LAB_DYNAMIC_NODES) that site.yml leaves out: the tests add it
# with scale.yml, then reset and remove it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export LAB_NAME=${PODNET_DAY2_LAB:-pnd2ci}
export LAB_SUBNET=${PODNET_DAY2_SUBNET:-203.0.113.32/27}
export LAB_NODES="ctl login c1 c2 c3"
export LAB_DYNAMIC_NODES=c3
export PODNET_DAY2_LAB=$LAB_NAME
LAB=$ROOT/tests/lab/lab.sh
mkdir -p "$ROOT/tests/output"
t0=$SECONDS
down() { [ "${PODNET_DAY2_KEEP:-0}" = 1 ] || "$LAB" down; }
trap down EXIT
"$LAB" down >/dev/null 2>&1 || true
"$LAB" up
echo "day2: site.yml without c3 (log tests/output/day2-$LAB_NAME-site.log)"
ansible-playbook -i "$("$LAB" inventory)" "$ROOT/playbooks/site.yml" --limit 'all:!c3' \
    >"$ROOT/tests/output/day2-$LAB_NAME-site.log" 2>&1 \
    || { tail -n 60 "$ROOT/tests/output/day2-$LAB_NAME-site.log"; exit 1; }
echo "day2: lab deployed in $((SECONDS - t0)) s"
python -m pytest -q -s -p no:cacheprovider "$ROOT/tests/day2"
echo "day2: total $((SECONDS - t0)) s"
