#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# podnet on a Slurm that the site configured without podnet (issue 21 item 5), on a lab that
# is up (LAB_NAME; Debian 12 nodes: LAB_OS=bookworm) and has no podnet yet:
#   1. the site's Slurm without PrologFlags=Contain: site.yml (slurm_manage: false) stops in
#      preflight naming the setting; /etc/slurm on every node is as it was, nothing deployed;
#   2. with it: site.yml deploys (warning that the site's Slurm has no PrivateData=jobs while
#      name privacy is on), adds its include block to the site's plugstack.conf (and the
#      plugstack.conf.d the site does not have), a job runs in its pod;
#   3. with an installed collection (PODNET_PLAYBOOKS=hpc.podnet): the upgrade to the same tree
#      built again with its version bumped, over a URL mirror, with a job running (upgrade.sh;
#      the next release is built by build-next.sh in the background from the start);
#   4. reset.yml: /etc/slurm on every node is byte for byte what the site had, Slurm runs jobs.
# Prints "existing-slurm: N passed, N failed". ANSIBLE_PLAYBOOK (default ansible-playbook),
# PODNET_PLAYBOOKS (default this checkout's playbooks/; hpc.podnet for an installed collection:
# then playbooks are named hpc.podnet.<name>) and PODNET_SITE_ARGS (extra ansible-playbook
# arguments, e.g. -e podnet_artifact_dir=...) choose the controller side. PODNET_SITE_E2E: a
# command (e.g. pytest of tests/e2e files) run after the deployment, before reset.
# PODNET_SITE_CONTROLLER: the controller of step 3 (controller.sh's DIR; default run.sh's);
# PODNET_SITE_UPGRADE=0 leaves step 3 out.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$here/../.." && pwd)
: "${LAB_NAME:?LAB_NAME: a lab that is up, without podnet}"
export LAB_NAME
lab=$ROOT/tests/lab/lab.sh
inv=$("$lab" inventory)
playbook=${ANSIBLE_PLAYBOOK:-ansible-playbook}
books=${PODNET_PLAYBOOKS:-$ROOT/playbooks}
read -r -a extra <<<"${PODNET_SITE_ARGS:-}"
out=$ROOT/tests/output/existing-slurm-$LAB_NAME
mkdir -p "$out"
# shellcheck source=/dev/null
nodes=$(. "/var/lib/podnet-lab/$LAB_NAME/lab.env" && echo "$LAB_NODES")
limit=${PODNET_SITE_LIMIT:-all}
passed=0 failed=0
ok() { echo "PASS $1"; passed=$((passed + 1)); }
ko() { echo "FAIL $1${2:+: $2}"; failed=$((failed + 1)); }
book() {   # book NAME: the playbook as the controller names it
    if [ "$books" = hpc.podnet ]; then echo "hpc.podnet.$1"; else echo "$books/$1.yml"; fi
}
etc_slurm() {   # every file and directory of /etc/slurm on every node: type, mode, owner, sha256
    local n
    for n in $nodes; do
        "$lab" ssh "$n" "cd /etc/slurm && find . -printf '%p %y %m %u %g\n' | sort && find . -type f | sort | xargs -r sha256sum" \
            | sed "s/^/$n: /"
    done
}
site_slurm() { ansible-playbook -i "$inv" "$here/site-slurm.yml" --limit "$limit" "$@" >>"$out/site-slurm.log" 2>&1; }
common=(-i "$inv" --limit "$limit" -e slurm_manage=false "${extra[@]}")
controller=${PODNET_SITE_CONTROLLER:-$ROOT/build/site-install/controller}
next=$ROOT/build/site-install/next
builder=
if [ "${PODNET_SITE_UPGRADE:-1}" != 0 ] && [ "$books" = hpc.podnet ]; then
    # the next release, built meanwhile (under a minute: the Go artifacts are cached)
    "$here/build-next.sh" "$next" "$("$lab" image)" >"$out/next-build.log" 2>&1 &
    builder=$!
    trap '[ -z "$builder" ] || kill "$builder" 2>/dev/null || true' EXIT
fi

# 1. a setting podnet needs is missing: a clear error, nothing written
site_slurm -e site_slurm_prolog_flags=
etc_slurm >"$out/1-before.txt"
if "$playbook" "${common[@]}" "$(book site)" >"$out/1-site.log" 2>&1; then
    ko "site.yml refuses a Slurm without PrologFlags=Contain" "it ran"
elif flat=$(tr -s ' \n' '  ' <"$out/1-site.log") \
        && grep -q "slurmctld runs with no PrologFlags; podnet needs Contain in it" <<<"$flat" \
        && grep -q "Nothing was changed: podnet does not edit the site" <<<"$flat"; then
    ok "site.yml refuses a Slurm without PrologFlags=Contain, naming the setting"
else
    ko "the error names PrologFlags=Contain" "$(grep -m3 -A6 'fatal:' "$out/1-site.log")"
fi
etc_slurm >"$out/1-after.txt"
if diff -u "$out/1-before.txt" "$out/1-after.txt" >"$out/1-diff.txt"; then ok "/etc/slurm untouched after the error"
else ko "/etc/slurm untouched after the error" "$(head -20 "$out/1-diff.txt")"; fi
left=$(for n in $nodes; do "$lab" ssh "$n" 'ls -d /etc/podnet /opt/podnet /etc/etcd/pki 2>/dev/null; true' | sed "s/^/$n:/"; done)
if [ -z "$left" ]; then ok "nothing deployed after the error"; else ko "nothing deployed after the error" "$left"; fi

# 2. the site's Slurm with what podnet needs: deploy
site_slurm
etc_slurm >"$out/2-before.txt"
if "$playbook" "${common[@]}" "$(book site)" >"$out/2-site.log" 2>&1; then ok "site.yml on the site's Slurm"
else ko "site.yml on the site's Slurm" "$(grep -m3 -A8 'fatal:' "$out/2-site.log")"; fi
# the site's Slurm lists every user's job names (no PrivateData=jobs) while name privacy is
# on: a warning, the deployment goes on (issue 35)
if tr -s ' \n' '  ' <"$out/2-site.log" \
        | grep -q "WARNING: name privacy is on (coredns_name_privacy) but slurmctld runs with PrivateData=none"; then
    ok "site.yml warns that the site's Slurm shows every job's name (no PrivateData=jobs)"
else ko "the PrivateData warning" "$(grep -m3 -i 'privatedata' "$out/2-site.log")"; fi
if [ -n "${PODNET_SITE_AIRGAP_PACKAGES:-}" ]; then   # air-gapped nodes (run.sh): from the bundle's archive
    bad=
    for n in $nodes; do
        # ctl (Slurm's controller, etcd, DNS) has neither Apptainer nor Flannel
        want=$PODNET_SITE_AIRGAP_PACKAGES
        [ "$n" = ctl ] || want="$want ${PODNET_SITE_AIRGAP_POD_PACKAGES:-}"
        got=$("$lab" ssh "$n" "ls -A /etc/apt/sources.list.d; ls /etc/apt/sources.list 2>&1 | grep -v 'No such'; \
            dpkg-query -W -f='\${db:Status-Abbrev}\${Package}\n' $want | grep -v '^ii ' ; \
            apt-cache policy nftables | grep -q 'file:/var/cache/podnet/debian ./' || echo 'nftables not from the archive'" 2>&1)
        [ "$got" = podnet.list ] || bad="$bad $n: $(tr '\n' ' ' <<<"$got")"
    done
    if [ -z "$bad" ]; then ok "air-gapped nodes: the purged packages came back from the bundle's archive, the only apt source"
    else ko "air-gapped nodes install from the bundle's archive" "$bad"; fi
fi
# configless: podnet's include block is in the controller's plugstack.conf, and c1 reads the
# copy slurmctld sent (/run/slurm/conf, after podnet's scontrol reconfigure), whose include
# resolves in c1's own plugstack.conf.d, where podnet.conf is
c1_plugstack=$("$lab" ssh c1 'cat /run/slurm/conf/plugstack.conf 2>/dev/null || cat /etc/slurm/plugstack.conf; ls /etc/slurm/plugstack.conf.d')
ctl_plugstack=$("$lab" ssh ctl cat /etc/slurm/plugstack.conf)
if grep -qx 'include /etc/slurm/plugstack.conf.d/\*.conf' <<<"$c1_plugstack" \
        && grep -q '^# SPANK plugins of the site' <<<"$c1_plugstack" && grep -qx podnet.conf <<<"$c1_plugstack" \
        && { [ "${PODNET_SITE_OPT_SLURM:-0}" = 0 ] || grep -q '^# BEGIN podnet (hpc.podnet.slurm)' <<<"$ctl_plugstack"; }; then
    ok "the site's plugstack.conf keeps its lines and includes plugstack.conf.d (podnet.conf in it)"
else ko "plugstack.conf include" "c1: $c1_plugstack ctl: $ctl_plugstack"; fi
if [ "${PODNET_SITE_OPT_SLURM:-0}" = 1 ]; then   # run.sh: the site's Slurm under /opt/slurm, configless
    flat=$(tr -s ' \n' '  ' <"$out/2-site.log")
    if grep -q "c1: Slurm 24.11.5 at /opt/slurm (commands /opt/slurm/bin, headers /opt/slurm/include, configuration /run/slurm/conf/slurm.conf from the controller: configless)" <<<"$flat" \
            && grep -q "login: Slurm 24.11.5 at /opt/slurm (commands /opt/slurm/bin, headers /opt/slurm/include, configuration /run/slurm/conf/slurm.conf from the controller: configless)" <<<"$flat" \
            && grep -q "ctl: Slurm 24.11.5 at /opt/slurm (commands /opt/slurm/bin, headers /opt/slurm/include, configuration /etc/slurm/slurm.conf)" <<<"$flat"; then
        ok "preflight names the site's Slurm it found (/opt/slurm, configless)"
    else ko "preflight names the site's Slurm" "$(grep -m2 -A3 'Name the Slurm found' "$out/2-site.log")"; fi
    built=$(grep -c "^changed: \[.*\] => (item=podnet_spank.so)\|TASK \[.*Build against this node's Slurm 24.11\]" "$out/2-site.log" || true)
    if grep -q "TASK \[.*Build against this node's Slurm 24.11\]" "$out/2-site.log" \
            && "$lab" ssh c2 "test -e /usr/local/lib/podnet/podnet_spank.so" \
            && [ "$(for n in c1 c2 login; do "$lab" ssh "$n" sha256sum /usr/local/lib/podnet/podnet_spank.so | cut -d' ' -f1; done | sort -u | wc -l)" = 1 ]; then
        ok "the native build for Slurm 24.11 (not in the release) built once on a node, the same plugin on c1, c2, login"
    else ko "the native build made on a node" "$built $(grep -m3 -A6 'Build against' "$out/2-site.log")"; fi
    nopkg=$("$lab" ssh c1 "dpkg-query -W -f='\${db:Status-Abbrev}\${Package}\n' 2>/dev/null | grep '^ii .*slurm'; command -v sinfo; ls /etc/slurm/slurm.conf 2>&1 | grep -v 'No such'; true")
    if [ -z "$nopkg" ]; then ok "c1: no Slurm package, no sinfo on root's PATH, no slurm.conf (configless)"
    else ko "c1 has only the site's /opt Slurm" "$nopkg"; fi
fi
job=$("$lab" ssh alice@login "cd /tmp && srun -N2 -w c1,c2 -t 2 ip -br -4 addr show eth0" 2>&1 || true)
if [ "$(grep -c ' 198\.1[89]\.' <<<"$job")" = 2 ]; then ok "a 2-node job runs in its pods"; else ko "a job in its pods" "$job"; fi
if [ -n "${PODNET_SITE_E2E:-}" ]; then   # the e2e tests a site's users would notice, on this deployment
    read -r -a e2e <<<"$PODNET_SITE_E2E"
    if "${e2e[@]}" >"$out/2-e2e.log" 2>&1; then ok "e2e: $(tail -n 1 "$out/2-e2e.log")"
    else ko "e2e" "$(grep -E '^(FAILED|ERROR)' "$out/2-e2e.log" | head -20; tail -n 1 "$out/2-e2e.log")"; fi
fi

# 3. the upgrade to the next release, over a URL mirror, with a job running
if [ -n "$builder" ]; then
    t3=$SECONDS
    if wait "$builder"; then
        builder=
        echo "existing-slurm: $(tail -n 1 "$out/next-build.log"), waited $((SECONDS - t3)) s for it"
        rc=0
        "$here/upgrade.sh" "$next" "$controller" >"$out/3-upgrade.txt" 2>&1 || rc=$?
        grep -E '^(PASS|FAIL|upgrade:) ' "$out/3-upgrade.txt" || true
        passed=$((passed + $(grep -c '^PASS ' "$out/3-upgrade.txt" || true)))
        failed=$((failed + $(grep -c '^FAIL ' "$out/3-upgrade.txt" || true)))
        if [ "$rc" != 0 ] && ! grep -q '^FAIL ' "$out/3-upgrade.txt"; then ko "upgrade.sh" "exited $rc: $(tail -n 5 "$out/3-upgrade.txt")"; fi
    else
        builder=
        ko "the next release builds (build-next.sh)" "$(tail -n 20 "$out/next-build.log")"
    fi
    echo "existing-slurm: upgrade step $((SECONDS - t3)) s"
fi

# 4. reset: the site's Slurm as the site left it
if "$playbook" "${common[@]}" "$(book reset)" -e podnet_confirm=yes >"$out/3-reset.log" 2>&1; then ok "reset.yml"
else ko "reset.yml" "$(grep -m3 -A8 'fatal:' "$out/3-reset.log")"; fi
etc_slurm >"$out/3-after.txt"
if [ -n "${PODNET_SITE_AIRGAP_PACKAGES:-}" ]; then
    left=$(for n in $nodes; do "$lab" ssh "$n" 'find /etc/apt/sources.list.d -mindepth 1; ls -d /var/cache/podnet 2>/dev/null; true' | sed "s/^/$n:/"; done)
    if [ -z "$left" ]; then ok "reset removes the bundle's apt source and archive"; else ko "reset removes the bundle's apt source" "$left"; fi
fi
if diff -u "$out/2-before.txt" "$out/3-after.txt" >"$out/3-diff.txt"; then ok "reset leaves /etc/slurm as the site had it"
else ko "reset leaves /etc/slurm as the site had it" "$(head -30 "$out/3-diff.txt")"; fi
job=$("$lab" ssh alice@login "cd /tmp && srun -N2 -w c1,c2 -t 2 hostname" 2>&1 | sort | tr '\n' ' ')
if [ "$job" = "c1 c2 " ]; then ok "Slurm runs jobs after reset"; else ko "Slurm runs jobs after reset" "$job"; fi

echo "existing-slurm: $passed passed, $failed failed"
[ "$failed" = 0 ]
