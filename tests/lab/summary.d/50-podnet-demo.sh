#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# lab.sh summary: podnet demo. alice runs a 2-node job; its pods, IPs and names; bob's
# pod on the same nodes cannot reach them, alice's pods reach each other by name.
set -uo pipefail
login=${LAB_LOGIN:-login}
if ! "$LAB_SH" ssh c1 'test -x /opt/podnet/venv/bin/podnetd' 2>/dev/null; then
    echo "podnet:    not deployed"
    exit 0
fi
on() { "$LAB_SH" ssh "$@" 2>&1; }
ja=$(on "$login" 'cd /tmp && runuser -u alice -- sbatch --parsable -J demo -N2 -w c1,c2 -t 2 --wrap "sleep 60"')
jb=$(on "$login" 'cd /tmp && runuser -u bob -- sbatch --parsable -J other -N2 -w c1,c2 -t 2 --wrap "sleep 60"')
for _ in $(seq 60); do
    [ "$(on "$login" "squeue -h -t R -j $ja,$jb | wc -l")" = 2 ] && break
    sleep 0.5
done
echo "podnet demo: alice's job $ja (demo) and bob's job $jb (other) on c1, c2"
for n in c1 c2; do on "$n" "podnet pods | grep -E ' ($ja|$jb) '" | sed "s/^/  $n: /"; done
a1=$(on c1 "podnet --json pods" | python3 -c "import json,sys; print([p['netns'].split('/')[-1] for p in json.load(sys.stdin) if p['job_id']==$ja][0])" 2>/dev/null)
b1=$(on c1 "podnet --json pods" | python3 -c "import json,sys; print([p['netns'].split('/')[-1] for p in json.load(sys.stdin) if p['job_id']==$jb][0])" 2>/dev/null)
if [ -n "$a1" ] && [ -n "$b1" ]; then
    r=$(on c1 "ip netns exec $a1 ping -c1 -W2 pod1.demo >/dev/null && echo reaches || echo 'does NOT reach'")
    echo "  alice pod0 (c1) -> pod1.demo.alice.lab (c2): $r"
    ip=$(on c1 "ip netns exec $a1 getent hosts pod1.demo" | awk '{print $1}')
    r=$(on c1 "ip netns exec $b1 ping -c1 -W2 $ip >/dev/null && echo 'REACHES (isolation broken!)' || echo 'cannot reach (isolated)'")
    echo "  bob pod (c1)   -> alice's pod1 $ip: $r"
fi
on "$login" "scancel $ja $jb" >/dev/null
