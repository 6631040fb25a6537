# SPDX-License-Identifier: Apache-2.0
"""etcd restored to a state older than a running job (restore.yml, docs/admin-guide.md
"Backup and restore"): the podnetds write the job's records back with the same addresses,
its pods keep working; a pod of a job that ended meanwhile is removed, never written back.

The restore here is logical (the keys written since the "snapshot" are deleted while the
podnetds are stopped); tests/day2 restores a real etcd snapshot with restore.yml."""

from __future__ import annotations

import itertools
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from conftest import Node, set_dead_jobs, wait_for
from test_pods import job_up, ping

PREFIXES = ("/podnet/t/", "/skydns/")


def keys(etcd: Any) -> set[str]:
    return {kv.key for p in PREFIXES for kv in etcd.client.get_prefix(p, keys_only=True)[0]}


def test_restore_to_before_a_running_job_keeps_its_pods_and_writes_its_records_back(
    cluster: dict[str, Node], workdir: Path, etcd: Any
) -> None:
    n1, n2 = cluster["n1"], cluster["n2"]
    snapshot = keys(etcd)
    nodes = ["n1", "n2"]
    # started after the snapshot, by a user the snapshot does not know: 801 runs, 802 ends
    # while the podnetds are down (its epilog could not reach them)
    p1, p2 = (job_up(n, 801, "rita", 2077, "late", nodes) for n in (n1, n2))
    ended = job_up(n1, 802, "rita", 2077, "ended", ["n1"])
    assert wait_for(lambda: ping(n1, p1, p2["ip"]), 20)
    pinger = subprocess.Popen(
        ["nsenter", f"--net={p1['netns']}", "ping", "-D", "-n", "-i", "0.2", "-W", "1", p2["ip"]],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for n in (n1, n2):
            n.stop()
        gone = keys(etcd) - snapshot
        assert "/podnet/t/jobs/801" in gone and "/podnet/t/users/rita" in gone
        for k in gone:
            etcd.client.delete(k)
        set_dead_jobs(workdir, [802])
        for n in (n1, n2):
            n.start()
        # the same addresses, the records back, the names too
        assert n1.call("job_get", job_id=801)["pod"]["ip"] == p1["ip"]
        assert n2.call("job_get", job_id=801)["pod"]["ip"] == p2["ip"]
        job = etcd.client.get_json("/podnet/t/jobs/801")
        assert job["user"] == "rita" and job["size"] == 2, job
        for i, (p, node) in enumerate(((p1, "n1"), (p2, "n2"))):
            rec = etcd.client.get_json(f"/podnet/t/ips/{p['ip']}")
            assert rec["job_id"] == 801 and rec["node"] == node, rec
            marker = etcd.client.get_json(f"/podnet/t/jobnodes/801/{node}")
            assert marker == {"index": i, "ip": p["ip"]}, marker
        assert etcd.client.get_json("/skydns/t/rita/801/pod0")["host"] == p1["ip"]
        assert etcd.client.get_json("/skydns/t/rita/late/pod1")["host"] == p2["ip"]
        assert etcd.client.get_json("/podnet/t/names/rita/late") == {"job_id": 801}
        assert etcd.client.get_json("/podnet/t/users/rita") is not None
        assert "records written back" in (n1.dir / "podnetd.log").read_text()
        # the job that ended: removed, nothing of it in etcd
        assert not Path(ended["netns"]).exists()
        assert etcd.client.get("/podnet/t/jobs/802") is None
        assert etcd.client.get(f"/podnet/t/ips/{ended['ip']}") is None
        assert etcd.client.get_prefix("/skydns/t/rita/802/")[0] == []
        assert wait_for(lambda: ping(n2, p2, p1["ip"]), 20)
        # the pinger goes on a moment: its replies after the restart close the gap, so the
        # gap is the outage (the restart can take less than a second on a quiet machine)
        time.sleep(2)
    finally:
        pinger.terminate()
        out, _ = pinger.communicate(timeout=10)
        set_dead_jobs(workdir, [])
    times = [float(m) for m in re.findall(r"^\[(\d+\.\d+)\] \d+ bytes from", out, re.M)]
    assert len(times) > 5 and times[-1] - times[0] > 2, out[-2000:]
    gap = max(b - a for a, b in itertools.pairwise(times))
    print(f"restore: longest gap between ping replies {gap:.2f} s ({len(times)} replies)")
    assert gap < 10, gap
    for n in (n1, n2):
        n.call("job_down", job_id=801)
    assert etcd.client.get("/podnet/t/jobs/801") is None
