# SPDX-License-Identifier: Apache-2.0
"""Opt-out steps (`--podnet=no`) launched where users launch them: over SSH from their
login pod (issue 22, point 4).

srun runs in alice's login pod; the step's slurmstepd on c1/c2 is on the node's host
network and connects back to srun (IO, `--pty`'s terminal) in that pod. The host-side
filter drops a user's host-side sockets to pods, and slurmstepd opens those connections
with the user's effective uid: before the fix every such step failed with "Slurmd could
not connect IO". Each test also shows that the fix opened nothing for alice's own
host-side processes: the opt-out tasks still reach no pod, not even her login pod.
"""

from __future__ import annotations

import base64
import ipaddress
import re
import subprocess

from conftest import POD_CIDR, ssh
from test_attack_ssh import ssh_cmd

#: in a task: its job, host address and the pods its node holds for the job
PROBE = (
    "echo JOB=$SLURM_JOB_ID HOST=$(hostname) CGROUP=$(grep ^0:: /proc/self/cgroup); "
    "ip -color=never -4 -o addr show scope global"
)
#: the cgroup whose sockets podnetd's host-side filter lets reach pods (slurmstepd's, on the
#: host network): the task tries to join it (cgroup v2 alone, or systemd's hybrid layout)
CGROUPS = ("/sys/fs/cgroup/podnet-stepd", "/sys/fs/cgroup/unified/podnet-stepd")
JOIN = "; ".join(
    f"if [ -d {d} ]; then echo STEPD-CGROUP; echo $$ >{d}/cgroup.procs && echo JOINED {d}; fi"
    for d in CGROUPS
)
PORT = 7521

#: a TCP + UDP listener (argv: log file) that logs every peer reaching it, for 110 s
LISTENER = f"""
import select, socket, sys, time
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("0.0.0.0", {PORT})); t.listen(8)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", {PORT}))
log = open(sys.argv[1], "a", buffering=1)
end = time.monotonic() + 110
while time.monotonic() < end:
    for s in select.select([t, u], [], [], 1)[0]:
        if s is t:
            c, a = t.accept(); log.write(f"tcp {{a[0]}}\\n"); c.close()
        else:
            _d, a = u.recvfrom(64); log.write(f"udp {{a[0]}}\\n")
"""
#: tries argv[1] (alice's login pod) over TCP and UDP
REACHER = f"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], {PORT}), 3).close(); print("TCP connected")
except OSError as e:
    print("TCP", e)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(3):
    try:
        u.sendto(b"x", (sys.argv[1], {PORT}))
    except OSError as e:
        print("UDP", e)
"""


def _py(src: str) -> str:
    """`python3 -c SRC` without quoting trouble in nested shells."""
    return f'python3 -c "$(echo {base64.b64encode(src.encode()).decode()} | base64 -d)"'


#: in alice's login session: the listener in her login pod, L=<its address> (exported:
#: srun passes the environment on to the tasks)
LISTEN = (
    f"rm -f /tmp/optout-$$.log; {_py(LISTENER)} /tmp/optout-$$.log & lp=$!; "
    f"for i in $(seq 50); do ss -ltn | grep -q ':{PORT} ' && break; sleep 0.2; done; "
    "export L=$(ip -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1); echo LOGIN=$L; "
)
#: try alice's own login pod
REACH = f"{_py(REACHER)} $L"
#: in an opt-out task: join podnet's cgroup for slurmstepd, then try alice's login pod
ATTACK = f"{JOIN}; {REACH}"
#: after the step: the login pod reaches its own listener (the control), then what reached
#: the listener, and stop it
REPORT = (
    f"; echo SRUN=$?; {REACH} >/dev/null; sleep 1; echo RECEIVED; cat /tmp/optout-$$.log; "
    "kill $lp; rm -f /tmp/optout-$$.log"
)


def _host_addresses(out: str, hosts: tuple[str, ...]) -> None:
    """Every task ran on its node's host network: it printed its host name, and only
    addresses outside the pod network."""
    for h in hosts:
        assert f"HOST={h}" in out, out
    assert not re.search(r"CGROUP=0::/podnet-stepd\b", out), out
    addrs = re.findall(r"inet (\S+)/", out)
    assert addrs, out
    inside = [a for a in addrs if ipaddress.ip_address(a) in ipaddress.ip_network(POD_CIDR)]
    assert not inside, f"opt-out task with a pod address {inside}:\n{out}"


def _nothing_reached_the_login_pod(out: str) -> None:
    """The opt-out tasks' TCP and UDP to alice's login pod were dropped; the login pod's own
    control connection arrived (the listener worked)."""
    login = re.findall(r"^LOGIN=(\S+)$", out, re.M)[0]
    assert "STEPD-CGROUP" in out, f"podnetd made no cgroup podnet-stepd:\n{out}"
    assert "JOINED" not in out, out
    assert "TCP connected" not in out, out
    received = [ln.split() for ln in out.split("RECEIVED", 1)[1].strip().splitlines()]
    assert ["tcp", login] in received, f"the control did not reach the listener:\n{out}"
    others = [r for r in received if r[-1] != login]
    assert others == [], f"alice's opt-out task reached her login pod: {others}\n{out}"


def _alice(cmd: str, timeout: float = 150) -> str:
    r = ssh("alice@login", f"cd /tmp && {cmd}", check=False, timeout=timeout)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "could not connect IO" not in r.stderr, r.stderr
    assert "SRUN=0" in r.stdout, f"{r.stdout}\n{r.stderr}"
    return r.stdout


def test_srun_opt_out_from_the_login_pod_one_node() -> None:
    out = _alice(f"{LISTEN}srun --podnet=no -N1 -w c1 -t 1 sh -c '{PROBE}; {ATTACK}'{REPORT}")
    _host_addresses(out, ("c1",))
    _nothing_reached_the_login_pod(out)


def test_srun_opt_out_from_the_login_pod_two_nodes() -> None:
    out = _alice(f"{LISTEN}srun --podnet=no -N2 -w c1,c2 -t 1 sh -c '{PROBE}; {ATTACK}'{REPORT}")
    _host_addresses(out, ("c1", "c2"))
    _nothing_reached_the_login_pod(out)


def test_salloc_then_srun_opt_out_from_the_login_pod() -> None:
    """The allocation has pods (salloc without --podnet=no); its opt-out step does not, and
    an allocation made with --podnet=no passes the option on to its steps."""
    out = _alice(
        f"{LISTEN}salloc -N2 -w c1,c2 -t 1 srun --podnet=no sh -c '{PROBE}; {ATTACK}'{REPORT}"
    )
    _host_addresses(out, ("c1", "c2"))
    _nothing_reached_the_login_pod(out)
    out = _alice(f"salloc --podnet=no -N1 -w c2 -t 1 srun sh -c '{PROBE}'; echo SRUN=$?")
    _host_addresses(out, ("c2",))


def test_srun_pty_opt_out_from_the_login_pod() -> None:
    """`srun --podnet=no --pty` from an interactive SSH session (`ssh -tt`): the task gets
    a terminal, and it is on the host network."""
    r = subprocess.run(
        [
            *ssh_cmd("alice", "login", "-tt"),
            f"cd /tmp && srun --podnet=no --pty -N1 -w c1 -t 1 sh -c 'tty; {PROBE}'; echo SRUN=$?",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    out = r.stdout.replace("\r", "")
    assert "SRUN=0" in out, f"{out}\n{r.stderr}"
    assert re.search(r"^(\^@)?/dev/pts/\d+\s*$", out, re.M), out
    _host_addresses(out, ("c1",))
