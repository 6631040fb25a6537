#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run molecule scenarios one after the other, each under a host-wide lock of its lab (two
# checkouts on one machine wait for each other), with its log in build/molecule-<scenario>/.
#   tests/molecule/run-scenarios.sh etcd coredns apptainer     (make test-roles)
# Every scenario runs even when one fails; the exit status is 1 if any failed. Prints each
# scenario's wall time. MOLECULE_LAB_NAME / MOLECULE_LAB_SUBNET move a lone scenario to
# another lab (tests/molecule/<scenario>/molecule.yml).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ "$#" -gt 0 ] || { echo "usage: $0 SCENARIO..." >&2; exit 2; }
cd "$root"
export MOLECULE_GLOB='tests/molecule/*/molecule.yml'
summary=() rc=0
for s in "$@"; do
    [ -f "tests/molecule/$s/molecule.yml" ] || { echo "run-scenarios: no scenario '$s'" >&2; exit 2; }
    # the etcd scenario's lab is pnha, the lab the former suite-etcd-ha used: same lock
    # host-wide, whatever PODNET_CACHE_DIR: two checkouts never run one scenario's lab at once
    lock=/run/lock/podnet-suite-molecule-$s.lock
    [ "$s" != etcd ] || lock=/run/lock/podnet-suite-etcd-ha.lock
    log=$root/build/molecule-$s/molecule.log
    mkdir -p "$(dirname "$log")"
    t0=$SECONDS
    echo "==== molecule test -s $s"
    if flock "$lock" molecule test -s "$s" 2>&1 | tee "$log"; then
        summary+=("$s: passed in $((SECONDS - t0)) s")
    else
        rc=1
        summary+=("$s: FAILED after $((SECONDS - t0)) s (log $log)")
        echo "==== molecule scenario $s failed: the failed tasks"
        sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E -A25 '(fatal|failed): \[|CRITICAL|ERROR ' | tail -n 150 || true
    fi
done
printf '==== %s\n' "${summary[@]}"
exit "$rc"
