#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The upgrade a site does between releases (issue 21 item 7; docs/install.md "Upgrading"), on
# the site install's lab once podnet is deployed (test-existing-slurm.sh runs it before reset):
#   1. the next release (build-next.sh: the same tree, version bumped) is served from a loopback
#      web server as a site's artifact mirror, and its collection tarball installed on the
#      site's controller (ansible-galaxy collection install --offline --force);
#   2. a job of alice's runs (submitted from her SSH session on the login node) while
#      hpc.podnet.upgrade runs with -e podnet_artifact_url=<the mirror> (every artifact from it:
#      the wheelhouse too, and the archive of Debian packages of the air-gapped nodes);
#   3. the job still runs in the same pods, which still answer by name; every podnet node runs
#      the new podnetd (its socket says so), the new wheel, the new native build's files; a new
#      job gets its pods and names;
#   4. upgrade again: nothing changes outside the backup (every run takes one) and no podnetd,
#      slurmd or sshd restarts.
#
#   LAB_NAME=... tests/site-install/upgrade.sh NEXT CONTROLLER
#
# NEXT: build-next.sh's OUT (NEXT/dist, NEXT/VERSION); CONTROLLER: controller.sh's DIR (venv,
# collections). ANSIBLE_PLAYBOOK (the controller's ansible-playbook), PODNET_SITE_ARGS (the
# deployment's arguments; its podnet_artifact_dir is replaced by the mirror's URL) and
# PODNET_SITE_LIMIT as for test-existing-slurm.sh. Prints PASS/FAIL lines and
# "upgrade: N passed, N failed"; exits 1 when one failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$here/../.." && pwd)
next=${1:?usage: upgrade.sh NEXT CONTROLLER}
controller=${2:?usage: upgrade.sh NEXT CONTROLLER}
: "${LAB_NAME:?LAB_NAME: a lab with podnet deployed}"
export LAB_NAME
lab=$ROOT/tests/lab/lab.sh
inv=$("$lab" inventory)
playbook=${ANSIBLE_PLAYBOOK:-ansible-playbook}
limit=${PODNET_SITE_LIMIT:-all}
out=$ROOT/tests/output/upgrade-$LAB_NAME
rm -rf "$out"
mkdir -p "$out"
# shellcheck source=/dev/null
nodes=$(. "/var/lib/podnet-lab/$LAB_NAME/lab.env" && echo "$LAB_NODES")
version=$(cat "$next/VERSION")
tarball=$next/dist/hpc-podnet-$version.tar.gz
passed=0 failed=0
ok() { echo "PASS $1"; passed=$((passed + 1)); }
ko() { echo "FAIL $1${2:+: $2}"; failed=$((failed + 1)); }
t0=$SECONDS
# root's Slurm commands on the nodes: a site's Slurm may be off root's default PATH (run.sh)
rp=${PODNET_E2E_ROOT_PATH:+PATH=$PODNET_E2E_ROOT_PATH:\$PATH; }
lap() { echo "upgrade: $1 at $((SECONDS - t0)) s"; }

# the deployment's arguments, with the mirror instead of the local bundle
read -r -a site_args <<<"${PODNET_SITE_ARGS:-}"
args=()
for ((i = 0; i < ${#site_args[@]}; i++)); do
    if [ "${site_args[i]}" = -e ] && [[ ${site_args[i + 1]:-} == podnet_artifact_dir=* ]]; then i=$((i + 1)); continue; fi
    args+=("${site_args[i]}")
done

# 1. the mirror: a web server on a free loopback port (the kernel's choice), killed at the end
server=
job=
cleanup() {
    [ -z "$job" ] || "$lab" ssh login "${rp}scancel $job" >/dev/null 2>&1 || true
    [ -z "$server" ] || kill "$server" 2>/dev/null || true
}
trap cleanup EXIT
python3 -u -m http.server --bind 127.0.0.1 --directory "$next/dist/artifacts" 0 >"$out/mirror.log" 2>&1 &
server=$!
port=
for _ in $(seq 50); do
    port=$(sed -n 's/^Serving HTTP on .* port \([0-9]*\) .*/\1/p' "$out/mirror.log")
    [ -n "$port" ] && break
    sleep 0.1
done
[ -n "$port" ] || { ko "artifact mirror" "$(cat "$out/mirror.log")"; echo "upgrade: $passed passed, $failed failed"; exit 1; }
url=http://127.0.0.1:$port
# the controller's cache and backups in the lane's output (an admin's default: ~/.cache, ~/.podnet)
cache=$out/controller-cache
args+=(-e "podnet_artifact_url=$url" -e "podnet_artifact_cache_dir=$cache" -e "podnet_backup_dir=$out/backups")
# SSH pipelining, as a site sets it in its ansible.cfg (the controller has none): one SSH
# round trip per task instead of four; the upgrade's 430 tasks took 390 s without it
args+=(-e ansible_pipelining=true)
common=(-i "$inv" --limit "$limit" -e slurm_manage=false "${args[@]}")
upgrade() {   # upgrade LOG: hpc.podnet.upgrade, its output in LOG, each play's start in LOG.plays
    local rc=0
    "$playbook" "${common[@]}" hpc.podnet.upgrade 2>&1 | while IFS= read -r line; do
        [[ $line != "PLAY ["* ]] || echo "$(date +%T) $line" >>"$1.plays"
        printf '%s\n' "$line"
    done >"$1" || rc=$?
    echo "$(date +%T) end (rc $rc)" >>"$1.plays"
    return "$rc"
}
clean=(env -i PATH="$controller/venv/bin:/usr/bin:/bin" HOME="${HOME:-/root}" LANG=C.UTF-8
       ANSIBLE_COLLECTIONS_PATH="$controller/collections")
if "${clean[@]}" ansible-galaxy collection install --offline --force -p "$controller/collections" "$tarball" \
        >"$out/galaxy.log" 2>&1 \
        && installed=$("${clean[@]}" ansible-galaxy collection list -p "$controller/collections" hpc.podnet 2>/dev/null) \
        && grep -qE "^hpc\.podnet +$version *\$" <<<"$installed"; then
    ok "hpc.podnet $version installed on the controller over the old one"
else ko "install hpc.podnet $version" "$(tail -5 "$out/galaxy.log"; echo "${installed:-}")"; fi
lap "mirror and collection ready"

# 2. a job that runs through the upgrade, submitted as alice does, its pods and names noted
pods_of() {   # pods_of NODE JOB: "ip netns" of the job's pod on NODE
    "$lab" ssh "$1" "podnet --json pods" | python3 -c "
import json, sys
print(' '.join(p['ip'] + ' ' + p['netns'] for p in json.load(sys.stdin) if p.get('job_id') == int(sys.argv[1])))" "$2"
}
job=$("$lab" ssh alice@login "cd /tmp && sbatch --parsable -J upg -N2 -w c1,c2 -o /tmp/upg-%j.out --wrap 'sleep 3600'" | tr -dc 0-9)
state=
for _ in $(seq 120); do
    state=$("$lab" ssh login "${rp}squeue -h -j $job -o %T" || true)
    [ "$state" = RUNNING ] && break
    sleep 0.5
done
declare -A before
for n in c1 c2; do before[$n]=$(pods_of "$n" "$job"); done
if [ "$state" = RUNNING ] && [ -n "${before[c1]}" ] && [ -n "${before[c2]}" ]; then
    ok "alice's job $job runs in its pods before the upgrade"
else ko "a job before the upgrade" "state '$state', pods c1 '${before[c1]}' c2 '${before[c2]}'"; fi
cluster=$("$lab" ssh c1 "podnet --json status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["cluster"])')
restarts() {   # what a second run must leave alone: podnetd's, slurmd's, sshd's start on each node
    local n
    for n in $nodes; do
        "$lab" ssh "$n" "for u in podnetd slurmd ssh; do echo \"\$u \$(systemctl show -p MainPID -p ExecMainStartTimestampMonotonic --value \$u | tr '\n' ' ')\"; done" \
            | sed "s/^/$n: /"
    done
}
lap "job running"

# 3. the upgrade, as an admin types it
if upgrade "$out/1-upgrade.log"; then ok "hpc.podnet.upgrade from $url"
else ko "hpc.podnet.upgrade from $url" "$(grep -m3 -A8 'fatal:' "$out/1-upgrade.log")"; fi
lap "upgrade"
fetched=$(grep -c '"GET /[^ ]* HTTP/1.[01]" 200' "$out/mirror.log" || true)
# the new native build: from the mirror, or (a platform the release lacks: the site's own
# Slurm, PODNET_E2E_NATIVE_BUILT) built on a node by the upgrade and kept on the controller
built=$(ls "${PODNET_E2E_NATIVE_BUILT:-/nonexistent}"/podnet-native-"$version"-*/SHA256SUMS 2>/dev/null || true)
if [ "$fetched" -gt 1 ] && grep -q "GET /podnet-native-$version-" "$out/mirror.log"; then
    ok "the new native build came from the mirror ($fetched files fetched)"
elif [ "$fetched" -gt 1 ] && [ -n "$built" ]; then
    ok "the artifacts came from the mirror ($fetched files fetched), the new native build from a node ($(dirname "$built"))"
else ko "artifacts from the mirror" "$(tail -5 "$out/mirror.log")"; fi

state=$("$lab" ssh login "${rp}squeue -h -j $job -o %T" || true)
same=yes
for n in c1 c2; do [ "$(pods_of "$n" "$job")" = "${before[$n]}" ] || same="no: $n had '${before[$n]}', now '$(pods_of "$n" "$job")'"; done
if [ "$state" = RUNNING ] && [ "$same" = yes ]; then ok "alice's job still runs, in the same pods"
else ko "the job runs on in its pods" "state '$state', same pods: $same"; fi
# its pods answer: a step of the job on c1 (alice, from the login node) reaches its pod on c2 by name
c2ip=${before[c2]%% *}
name=pod1.$job.alice.$cluster
got=$("$lab" ssh alice@login "cd /tmp && srun --jobid=$job --overlap -N1 -n1 -w c1 -t 1 sh -c 'getent hosts $name && ping -c 1 -W 2 $name >/dev/null && echo answered'" 2>&1 || true)
if grep -q "^$c2ip " <<<"$got" && grep -qx answered <<<"$got"; then ok "its pod on c2 still answers by name ($name)"
else ko "the job's pod answers" "$got"; fi

bad=
want_sums=$(grep " podnet-native-$version-" "$next/dist/artifacts/SHA256SUMS"
    # a build the deployment made on a node (a platform the release lacks: podnet_native_build_dir)
    for d in "${PODNET_E2E_NATIVE_BUILT:-/nonexistent}"/podnet-native-"$version"-*/; do
        if [ -f "$d/SHA256SUMS" ]; then sed "s|  |  $(basename "$d")/|" "$d/SHA256SUMS"; fi
    done)
for n in $nodes; do
    got=$("$lab" ssh "$n" "podnet --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"version\"])';
        /opt/podnet/venv/bin/python -c 'import importlib.metadata as m; print(m.version(\"podnet\"))'" 2>&1 | tr '\n' ' ')
    [ "$got" = "$version $version " ] || bad+="$n: podnetd and wheel say '$got'; "
done
for n in login c1 c2; do
    files=$("$lab" ssh "$n" "cd /usr/local/lib/podnet && sha256sum podnet_spank.so podnet-init podnet-image-exec podnet-cni; sha256sum /usr/local/lib/security/pam_podnet.so")
    while read -r sum f; do
        grep -q "^$sum  podnet-native-$version-[^/]*/$(basename "$f")\$" <<<"$want_sums" || bad+="$n: $f is not $version's build; "
    done <<<"$files"
done
if [ -z "$bad" ]; then ok "every node runs podnet $version (podnetd, wheel, native build's files)"
else ko "every node runs podnet $version" "$bad"; fi

new=$("$lab" ssh alice@login "cd /tmp && srun -N2 -w c1,c2 -t 2 sh -c 'ip -br -4 addr show eth0; getent hosts pod\$SLURM_NODEID.\$SLURM_JOB_ID.alice.$cluster'" 2>&1 || true)
if [ "$(grep -cE '^eth0(@[^ ]+)? .* 198\.1[89]\.' <<<"$new")" = 2 ] && [ "$(grep -cE '^198\.1[89]\.[0-9.]+ +pod[01]\.' <<<"$new")" = 2 ]; then
    ok "a new job gets its pods and names"
else ko "a new job gets its pods and names" "$new"; fi
lap "checks"

# 4. again: nothing to do but the backup, nothing restarted
restarts >"$out/2-before.txt"
gets=$(wc -l <"$out/mirror.log")
if upgrade "$out/2-upgrade.log"; then
    # the tasks that changed something, outside the backup's plays
    changed=$(awk '/^PLAY \[/ { backup = ($0 ~ /[Bb]ack/) } /^TASK \[/ { task = $0 }
                   /^changed: / && !backup { print task " " $2 }' "$out/2-upgrade.log")
    restarts >"$out/2-after.txt"
    if [ -z "$changed" ] && diff -q "$out/2-before.txt" "$out/2-after.txt" >/dev/null; then
        ok "a second upgrade changes nothing (outside the backup) and restarts nothing"
    else ko "a second upgrade changes nothing" "$changed $(diff "$out/2-before.txt" "$out/2-after.txt" | head -10)"; fi
else ko "hpc.podnet.upgrade again" "$(grep -m3 -A8 'fatal:' "$out/2-upgrade.log")"; fi
lap "second upgrade"
again=$(tail -n +"$((gets + 1))" "$out/mirror.log" | grep '"GET ' | grep -v '"GET /SHA256SUMS ' || true)
if [ -z "$again" ]; then ok "nothing fetched twice (the second run read the mirror's SHA256SUMS only)"
else ko "nothing fetched twice" "$(head -5 <<<"$again")"; fi
state=$("$lab" ssh login "${rp}squeue -h -j $job -o %T" || true)
if [ "$state" = RUNNING ]; then ok "alice's job ran through both upgrades"; else ko "the job ran through both upgrades" "state '$state'"; fi

echo "upgrade: $passed passed, $failed failed ($((SECONDS - t0)) s)"
[ "$failed" = 0 ]
