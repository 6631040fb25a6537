#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Self-test of the lab harness on a throwaway lab of its own (never pnlab):
# up, SSH as root and as the lab users, per-node identity, idempotent re-up,
# recovery from a SIGKILLed nspawn, a cgroup hierarchy of its own for each node, and a
# down that leaves nothing behind (no cgroup either, even of an orphaned node).
#   tests/lab/test-lab.sh      (prints "lab: N passed, N failed")
# Env: TEST_LAB_NAME (pnlt), TEST_LAB_SUBNET (203.0.113.240/28: small-test
#      range, so it never competes with labs on 198.51.100.0/24).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ "$(id -u)" = 0 ] || { echo "test-lab: run as root" >&2; exit 1; }
export LAB_NAME=${TEST_LAB_NAME:-pnlt}
export LAB_SUBNET=${TEST_LAB_SUBNET:-203.0.113.240/28}
export LAB_NODES="ctl c1"
unset LAB_INVENTORY LAB_ETCD_NODES
[ "$LAB_NAME" != pnlab ] || { echo "test-lab: refusing to test on pnlab" >&2; exit 1; }
lab=$here/lab.sh
state=/var/lib/podnet-lab/$LAB_NAME
passed=0 failed=0
ok() { echo "PASS $1"; passed=$((passed + 1)); }
ko() { echo "FAIL $1${2:+: $2}"; failed=$((failed + 1)); }
check() {   # check NAME EXPECTED ACTUAL
    if [ "$2" = "$3" ]; then ok "$1"; else ko "$1" "expected '$2', got '$3'"; fi
}
cleanup() { "$lab" down >/dev/null 2>&1 || true; }
trap cleanup EXIT

[ ! -d "$state" ] || { echo "test-lab: $state exists (a lab $LAB_NAME is up?)" >&2; exit 1; }

t0=$SECONDS
if "$lab" up >"/tmp/test-lab-$LAB_NAME.log" 2>&1; then ok "up ($((SECONDS - t0)) s)"; else
    cat "/tmp/test-lab-$LAB_NAME.log"; ko "up"; echo "lab: $passed passed, $failed failed"; exit 1
fi
rm -f "/tmp/test-lab-$LAB_NAME.log"
ctl_ip=$(awk '$2 == "ctl" { print $1 }' "$state/nodes/ctl/root/etc/hosts")
c1_ip=$(awk '$2 == "c1" { print $1 }' "$state/nodes/ctl/root/etc/hosts")
check "addresses .10, .11 of the subnet" "203.0.113.250 203.0.113.251" "$ctl_ip $c1_ip"
check "hostname ctl" "ctl" "$("$lab" ssh ctl hostname)"
check "hostname c1" "c1" "$("$lab" ssh c1 hostname)"
for u in alice:2001 bob:2002 carol:2003 labadmin:2100; do
    check "ssh as ${u%%:*} (uid ${u#*:})" "${u#*:}" "$("$lab" ssh "${u%%:*}@c1" id -u 2>&1)"
done
check "labadmin: podnet-admins, passwordless sudo" "podnet-admins 0" \
    "$("$lab" ssh labadmin@ctl 'id -gn; sudo -n id -u' | tr '\n' ' ' | sed 's/ $//')"
check "node -> node by name" "ok" "$("$lab" ssh c1 'getent hosts ctl >/dev/null && timeout 3 bash -c "exec 3<>/dev/tcp/ctl/22" && echo ok')"
check "no default route in nodes" "" "$("$lab" ssh c1 ip -4 route show default)"
m1=$("$lab" ssh ctl cat /etc/machine-id); m2=$("$lab" ssh c1 cat /etc/machine-id)
if [ -n "$m1" ] && [ "$m1" != "$m2" ]; then ok "unique machine-id"; else ko "unique machine-id" "$m1 / $m2"; fi
k1=$("$lab" ssh ctl cat /etc/ssh/ssh_host_ed25519_key.pub); k2=$("$lab" ssh c1 cat /etc/ssh/ssh_host_ed25519_key.pub)
if [ -n "$k1" ] && [ "$k1" != "$k2" ]; then ok "unique SSH host keys"; else ko "unique SSH host keys"; fi
check "roles' daemons are off until configured" "inactive inactive inactive inactive" \
    "$("$lab" ssh ctl 'systemctl is-active slurmctld slurmd etcd munge' | tr '\n' ' ' | sed 's/ $//')"
check "inventory groups" "etcd:ctl dns:ctl compute:c1" \
    "$(awk '/^        [a-z]+:$/ { g = $1; sub(/:$/, "", g) }
            /^            [a-z0-9-]+: \{\}$/ { h = $1; sub(/:$/, "", h); print g ":" h }' "$state/hosts.yml" \
       | grep -E '^(etcd|dns|compute):' | tr '\n' ' ' | sed 's/ $//')"
check "host table present" "1" "$(nft list tables | grep -cx "table inet ${LAB_NAME}_host")"

# the image selectors: bad values and a lab's OS changed under it are refused, nothing built
refused() {   # refused NAME MESSAGE_PART CMD...: CMD fails and says MESSAGE_PART
    local out
    if out=$("${@:3}" 2>&1); then ko "$1" "accepted"; elif [[ $out == *"$2"* ]]; then ok "$1"; else ko "$1" "$out"; fi
}
refused "LAB_OS=bogus refused" "LAB_OS must be trixie or bookworm" env LAB_OS=bogus "$lab" up
refused "LAB_OS=bookworm with LAB_SLURM=sid refused" "needs LAB_OS=trixie" \
    env LAB_OS=bookworm LAB_SLURM=sid "$lab" image
refused "another LAB_OS for a running lab refused" "lab exists with LAB_OS=trixie" \
    env LAB_OS=bookworm "$lab" up
check "inventory names the nodes' OS" "podnet_lab_os: trixie" "$(grep -o 'podnet_lab_os: .*' "$state/hosts.yml")"

# re-up with the nodes running keeps them as they are (the same nspawn processes, the same
# init: pid and start time): behaviour, not a time (bench figures live in tests/bench)
procs() { cat "$state"/nodes/{ctl,c1}/pid "$state"/nodes/{ctl,c1}/init | tr '\n' ' '; }
before=$(procs)
if "$lab" up >/dev/null; then ok "re-up with nodes running"; else ko "re-up with nodes running"; fi
check "re-up kept the nodes' nspawn and init processes" "$before" "$(procs)"
check "c1 answers after re-up" "c1" "$("$lab" ssh c1 hostname)"

# each node has a cgroup v2 hierarchy of its own (a cgroup namespace rooted in the lab's
# cgroup for it): what c1 makes there (podnetd's podnet-stepd, tests/e2e/test_optout.py) is
# not ctl's, and ctl's shutdown (its systemd removes every empty cgroup it sees) leaves it be
v2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts)
if [ -z "$v2" ]; then
    ko "node cgroups" "no cgroup2 mount on this host"
else
    rel=${v2#/sys/fs/cgroup}   # "" (cgroup v2 alone) or /unified (systemd's hybrid layout)
    probe=/sys/fs/cgroup$rel/pnlt-probe
    c1_init=$(awk '{ print $1 }' "$state/nodes/c1/init")
    check "c1's cgroup on the host: the lab's own" "/podnet-lab/$LAB_NAME-c1/" \
        "$(sed -n 's/^0:://p' "/proc/$c1_init/cgroup" | grep -o "^/podnet-lab/$LAB_NAME-c1/")"
    check "c1 is at the root of its own hierarchy" "0::/init.scope" "$("$lab" ssh c1 'grep ^0:: /proc/1/cgroup')"
    "$lab" ssh c1 "rmdir $probe 2>/dev/null; mkdir $probe"
    check "a cgroup made on c1 is not on ctl" "absent" \
        "$("$lab" ssh ctl "[ -d $probe ] && echo present || echo absent")"
    "$lab" ssh ctl 'systemctl poweroff' >/dev/null 2>&1 || true
    ctl_pid=$(<"$state/nodes/ctl/pid")
    for _ in $(seq 300); do kill -0 "$ctl_pid" 2>/dev/null || break; sleep 0.1; done
    check "ctl shut down (its nspawn exited)" "exited" \
        "$(kill -0 "$ctl_pid" 2>/dev/null && echo running || echo exited)"
    check "ctl's shutdown left c1's cgroup be" "present" \
        "$("$lab" ssh c1 "[ -d $probe ] && echo present || echo absent")"
    "$lab" ssh c1 "rmdir $probe 2>/dev/null" || true
    if "$lab" up >/dev/null 2>&1; then ok "up after ctl's shutdown"; else ko "up after ctl's shutdown"; fi
    check "ctl answers after its restart" "ctl" "$("$lab" ssh ctl hostname 2>&1)"
fi

pid=$(<"$state/nodes/c1/pid")
old_init=$(awk '{ print $1 }' "$state/nodes/c1/init")
kill -KILL "$pid"
if "$lab" up >/dev/null 2>&1; then ok "up after SIGKILL of c1's nspawn"; else ko "up after SIGKILL"; fi
check "c1 answers after recovery" "c1" "$("$lab" ssh c1 hostname 2>&1)"
check "the orphaned container of the killed nspawn is gone" "gone" \
    "$(if [ -n "$old_init" ] && kill -0 "$old_init" 2>/dev/null; then echo "alive ($old_init)"; else echo gone; fi)"

pids=$(cat "$state"/nodes/*/pid "$state"/nodes/*/init 2>/dev/null | awk '{ print $1 }' | tr '\n' ' ')
kill -KILL "$(<"$state/nodes/c1/pid")"   # down finds c1's container orphaned, as up did above
if "$lab" down >/dev/null; then ok "down (c1's nspawn killed before)"; else ko "down"; fi
alive=""
for p in $pids; do kill -0 "$p" 2>/dev/null && alive+="$p "; done
check "down: no process left" "" "$alive"
check "down: no bridge" "" "$(ip -o link show dev "${LAB_NAME}br0" 2>/dev/null)"
check "down: no nft table" "0" "$(nft list tables | grep -cx "table inet ${LAB_NAME}_host" || true)"
check "down: no mount" "0" "$(grep -c "/var/lib/podnet-lab/$LAB_NAME/" /proc/mounts || true)"
check "down: no cgroup of the lab's left" "" \
    "$(awk '$3 == "cgroup2" || ($3 == "cgroup" && $4 ~ /name=systemd/) { print $2 }' /proc/self/mounts |
       while read -r h; do ls -d "$h/podnet-lab/$LAB_NAME"-* 2>/dev/null; done)"
check "down: no state dir" "absent" "$([ -e "$state" ] && echo present || echo absent)"

echo "lab: $passed passed, $failed failed"
[ "$failed" = 0 ]
