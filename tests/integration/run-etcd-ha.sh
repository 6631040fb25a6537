#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The 3-member etcd proof on a lab of its own: converge, idempotence, check mode, shrink to
# one member and grow back, a member removed with etcd_member and re-added by the role while
# data stays readable, and a configuration change restarting members one at a time.
#   tests/integration/run-etcd-ha.sh        (make test-etcd-ha; part of make test)
# Env: HA_LAB_NAME (pnha), HA_LAB_SUBNET (198.51.100.96/27).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
[ "$(id -u)" = 0 ] || { echo "run-etcd-ha: run as root" >&2; exit 1; }
export LAB_NAME=${HA_LAB_NAME:-pnha}
export LAB_SUBNET=${HA_LAB_SUBNET:-198.51.100.96/27}
export LAB_NODES="ctl ctl2 ctl3" LAB_ETCD_NODES="ctl ctl2 ctl3"
unset LAB_INVENTORY
[ "$LAB_NAME" != pnlab ] || { echo "run-etcd-ha: refusing to use pnlab" >&2; exit 1; }
lab=$root/tests/lab/lab.sh
trap '"$lab" down >/dev/null 2>&1 || true' EXIT
"$lab" down >/dev/null 2>&1 || true
"$lab" up
PODNET_ETCD_LAB_INVENTORY=$("$lab" inventory) \
    "${PYTHON:-$root/.venv/bin/python}" -m pytest -q "$here/test_etcd_role_lab.py"
