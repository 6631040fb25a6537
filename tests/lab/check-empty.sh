#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Check mode on a cluster where nothing is installed yet (issue 12): site.yml --check --diff,
# then every day-2 playbook --check --diff with what its header asks for (check mode asks no
# confirmation: no podnet_confirm), against freshly booted lab nodes. The playbooks are the
# collection's (hpc.podnet.<name>: the one ANSIBLE_COLLECTIONS_PATH or ansible.cfg finds). Each must end with rc 0 and no failed task;
# nothing on the nodes changes (only the controller PKI is created: docs/admin-guide.md).
#   tests/lab/check-empty.sh INVENTORY [LOG_DIR]
# Not in CI: it takes longer than CI leaves (17.5 min for the 9 playbooks on 4 nodes at a
# load of 5, site.yml 7.5 min and upgrade.yml 10 of it; 2026-11-26). The day-2
# runs go CHECK_EMPTY_JOBS at a time (default 3); NODE (default: the last compute node) is the
# --limit of scale.yml and reset.yml and the node remove_node.yml removes.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
INV=${1:?usage: check-empty.sh INVENTORY [LOG_DIR]}
LOGS=${2:-$ROOT/tests/output/check-empty}
JOBS=${CHECK_EMPTY_JOBS:-3}
mkdir -p "$LOGS"
rm -f "$LOGS"/*.log "$LOGS"/*.res

NODE=${NODE:-$(ansible-inventory -i "$INV" --list 2>/dev/null \
    | python3 -c 'import json,sys; print((json.load(sys.stdin).get("compute", {}).get("hosts") or [""])[-1])')}
[ -n "$NODE" ] || { echo "check-empty: no compute node in $INV" >&2; exit 2; }

# restore.yml needs a backup directory (playbooks/backup.yml's layout); an empty snapshot is
# enough for check mode, which copies and restores nothing
BACKUP=$(mktemp -d /tmp/podnet-check-backup.XXXXXX)
trap 'rm -rf "$BACKUP"' EXIT
: >"$BACKUP/etcd.db"
printf '{"cluster": "check", "jobs": []}\n' >"$BACKUP/backup.json"
(cd "$BACKUP" && sha256sum etcd.db backup.json >SHA256SUMS)
# scale.yml adds NODE as its header says: a Slurm dynamic node (a static one would need every
# Slurm host in the run, ctl included, which is also etcd and DNS here)
printf 'all:\n  hosts:\n    %s:\n      slurm_node_dynamic: true\n' "$NODE" >"$BACKUP/dynamic.yml"

# one run: NAME PLAYBOOK [ARGS...] -> $LOGS/NAME.log, $LOGS/NAME.res ("NAME rc ok changed failed s")
run() {
    local name=$1 pb=$2 t0=$SECONDS rc
    shift 2
    ANSIBLE_NOCOLOR=1 ansible-playbook -i "$INV" "hpc.podnet.${pb%.yml}" --check --diff "$@" \
        >"$LOGS/$name.log" 2>&1
    rc=$?
    awk -v n="$name" -v rc="$rc" -v s=$((SECONDS - t0)) '
        /^PLAY RECAP/ {recap = 1; next}
        recap && / : ok=/ {
            for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] += kv[2] }
        }
        END { printf "%-12s rc=%-3s ok=%-4d changed=%-4d failed=%-3d unreachable=%d %ss\n",
              n, rc, v["ok"], v["changed"], v["failed"], v["unreachable"], s }' \
        "$LOGS/$name.log" >"$LOGS/$name.res"
    cat "$LOGS/$name.res"
}
export -f run
export INV LOGS ROOT BACKUP

t0=$SECONDS
echo "check-empty: site.yml --check --diff on $INV"
run site site.yml
# day 2, on the same empty nodes (the controller PKI exists now: no two runs issue a
# certificate at once)
printf '%s\n' \
    "upgrade upgrade.yml" \
    "scale scale.yml --limit $NODE -i $BACKUP/dynamic.yml" \
    "remove_node remove_node.yml -e podnet_remove_nodes=$NODE" \
    "reset reset.yml --limit $NODE" \
    "backup backup.yml" \
    "restore restore.yml -e podnet_restore_from=$BACKUP" \
    "certs certs.yml" \
    "certs_rollout certs_rollout.yml" \
    | xargs -P "$JOBS" -L 1 bash -c 'run "$@"' _

fail=0
for res in "$LOGS"/*.res; do
    name=$(basename "$res" .res)
    if ! grep -q 'rc=0 .* failed=0 ' "$res"; then
        fail=1
        echo "==== check-empty: $name failed; its failed tasks ($LOGS/$name.log):"
        sed 's/\x1b\[[0-9;]*m//g' "$LOGS/$name.log" | grep -E -A20 '(fatal|failed): \[|ERROR' | head -n 80
    fi
done
echo "check-empty: $(cat "$LOGS"/*.res | wc -l) playbooks in $((SECONDS - t0)) s, $([ $fail = 0 ] && echo all clean || echo FAILED)"
exit $fail
