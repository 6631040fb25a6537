# SPDX-License-Identifier: Apache-2.0
"""A user's burst waits its turn (issue 35, item 5; docs/api.md "Connections").

alice starts 60 `podnet-container` at once in her login session on login (what workflow
tools do): before, 16 ran and 44 failed with "too many connections from uid 2001 (at most 8
at once) (EUNAVAIL)", far below her quota of 32 containers per node. Now exactly the quota
runs and every other one is refused with EQUOTA, none with EUNAVAIL; bob's container,
started while the burst is served, is not delayed by more than the stated bound.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess

from conftest import LAB, REPO, ssh, wait_for
from test_quota import limits_on_login, my_containers

BURST = 60
#: the stated bound (docs/api.md "Connections"): what a flood may add to another user's
#: container_add
DELAY_BOUND_S = 2.0
D = "/tmp/e2eburst"
GO = f"{D}.go"

#: alice's login session: BURST podnet-container at once, each writing when it started
#: (ok.<i>) or, refused, its error (err.<i>) and when (end.<i>); GO once 8 are launched
#: (bob's container then starts while the rest arrive and wait);
#: the session stays (the lab's login pod ends its processes 5 s after the last session)
#: until the test writes stop
ALICE = f"""set -u
rm -rf {D}; mkdir -p {D}
one() {{
  podnet-container --name e2eburst-$1 -- sh -c "date +%s.%N >{D}/ok.$1; exec sleep 3131" \\
    </dev/null >/dev/null 2>{D}/err.$1
  date +%s.%N >{D}/end.$1
}}
for i in $(seq {BURST}); do
  one $i &
  if [ $i = 8 ]; then touch {GO}; fi
done
echo LAUNCHED
n=0
while [ ! -e {D}/stop ] && [ $n -lt 3000 ]; do sleep 0.1; n=$((n + 1)); done
pkill -u alice -f '^sleep 3131$'
wait
echo DONE
"""

#: bob's container, timed on the node: at once, or (go) as soon as GO exists
BOB = """{wait}s=$(date +%s.%N); podnet-container --name e2eburst-{name} -- true; rc=$?
e=$(date +%s.%N); echo BOB $rc $s $e
"""


def as_script(text: str) -> str:
    """A shell command line that runs `text` as a script (no quoting trouble)."""
    return f"echo {base64.b64encode(text.encode()).decode()} | base64 -d | sh"


def bob_container(name: str, go: bool) -> subprocess.Popen[str]:
    wait = f"echo READY; while [ ! -e {GO} ]; do sleep 0.05; done\n" if go else ""
    return subprocess.Popen(
        [
            str(REPO / "tests/lab/lab.sh"),
            "ssh",
            "bob@login",
            as_script(BOB.format(wait=wait, name=name)),
        ],
        env={**os.environ, "LAB_NAME": LAB},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def bob_result(p: subprocess.Popen[str]) -> tuple[float, float]:
    """bob's container's start and end (epoch seconds on login)."""
    out, _ = p.communicate(timeout=120)
    m = re.search(r"^BOB (\d+) ([\d.]+) ([\d.]+)$", out, re.M)
    assert m and m.group(1) == "0", f"bob's container failed: {out}"
    return float(m.group(2)), float(m.group(3))


def outcomes() -> dict[str, dict[int, str]]:
    """What each of alice's containers left: ok/end (times), err (podnet-container's
    stderr), by kind and index."""
    out = ssh("login", f"cd {D} && grep -H . ok.* end.* err.* 2>/dev/null", check=False).stdout
    got: dict[str, dict[int, str]] = {"ok": {}, "end": {}, "err": {}}
    for line in out.splitlines():
        m = re.match(r"^(ok|end|err)\.(\d+):(.*)$", line)
        if m:
            kind, i = m.group(1), int(m.group(2))
            got[kind][i] = (got[kind].get(i, "") + "\n" + m.group(3)).strip()
    return got


def test_a_burst_of_60_gets_the_quota_the_rest_equota_and_bob_is_served() -> None:
    quota = limits_on_login()["containers_per_node"]
    assert quota < BURST, quota
    wait_for(lambda: not my_containers("alice"), 60)
    ssh("login", f"rm -rf {D} {GO}")
    unloaded = bob_result(bob_container("bob0", go=False))
    bob = bob_container("bob1", go=True)
    alice: subprocess.Popen[str] | None = None
    try:
        assert bob.stdout is not None
        assert bob.stdout.readline().strip() == "READY"
        alice = subprocess.Popen(
            [str(REPO / "tests/lab/lab.sh"), "ssh", "alice@login", as_script(ALICE)],
            env={**os.environ, "LAB_NAME": LAB},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert alice.stdout is not None
        assert alice.stdout.readline().strip() == "LAUNCHED"
        loaded = bob_result(bob)

        def all_answered() -> dict[str, dict[int, str]] | None:
            got = outcomes()
            answered = set(got["ok"]) | set(got["end"])
            return got if len(answered) == BURST else None

        got = wait_for(all_answered, 120, 1.0)
        started = sorted(got["ok"])
        refused = {i: got["err"].get(i, "") for i in got["end"] if i not in got["ok"]}
        assert not [e for e in refused.values() if "EUNAVAIL" in e], refused
        assert len(started) == quota, (started, refused)
        assert len(refused) == BURST - quota, refused
        for err in refused.values():
            assert "(EQUOTA)" in err, err
            assert f"containers per user on a node on login is {quota}" in err, err
        assert len(my_containers("alice")) == quota
        # bob: not delayed by more than the bound, and asked while the burst was answered
        took_alone, took = unloaded[1] - unloaded[0], loaded[1] - loaded[0]
        eunavail = sum("EUNAVAIL" in e for e in refused.values())
        equota = sum("(EQUOTA)" in e for e in refused.values())
        print(
            f"burst of {BURST}: {len(started)} started (quota {quota}), {equota} EQUOTA, "
            f"{eunavail} EUNAVAIL; bob's container took {took:.2f} s during it, "
            f"{took_alone:.2f} s alone (bound +{DELAY_BOUND_S} s)"
        )
        assert took - took_alone <= DELAY_BOUND_S, (took_alone, took)
        last = max(float(t) for t in [*got["ok"].values(), *(got["end"][i] for i in refused)])
        assert loaded[0] < last, "the burst was answered before bob asked: proved nothing"
    finally:
        bob.kill()
        ssh("alice@login", f"touch {D}/stop", check=False)
        if alice is not None:
            try:
                alice.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                alice.kill()
        ssh("login", f"rm -rf {D} {GO}", check=False)
    wait_for(lambda: not my_containers("alice"), 60)
