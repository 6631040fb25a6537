# SPDX-License-Identifier: Apache-2.0
"""Kernel state against etcd: adopt at start, collect garbage while running.

At start (`reconcile`), every pod netns left by an earlier podnetd is adopted if etcd
still says it belongs here (a live pod is never torn down because the daemon
restarted), else removed; then routes, bridges and firewall entries with no pod are
removed. While running (`gc_once`, every `gc_interval`), job pods whose job Slurm no
longer knows are removed, and job records of jobs that ended on nodes that died are
released.
"""

from __future__ import annotations

import logging
import pwd
import subprocess
import threading
import time
from collections.abc import Callable

from podnet import nl
from podnet.alloc import Allocator, Job
from podnet.config import ClusterConfig, NodeConfig
from podnet.containers import is_container_ns
from podnet.dataplane import Dataplane
from podnet.etcd_sync import EtcdSync
from podnet.names import Keys
from podnet.pods import Pod, PodTable
from podnet.sessions import LoginSessions
from podnet.store import Etcd
from podnet.usernets import UserNetworks

log = logging.getLogger("podnet.reconcile")

#: a job pod younger than this is never collected (Slurm may not list its job yet)
GC_MIN_POD_AGE = 5.0
#: job records of jobs Slurm forgot are released after this many seconds
GC_MIN_RECORD_AGE = 60.0


class Reconciler:
    def __init__(
        self,
        cfg: NodeConfig,
        cc: ClusterConfig,
        etcd: Etcd,
        keys: Keys,
        alloc: Allocator,
        dp: Dataplane,
        pods: PodTable,
        nets: UserNetworks,
        sync: EtcdSync,
        sessions: LoginSessions,
        lease_id: Callable[[], int],
    ) -> None:
        self.cfg = cfg
        self.cc = cc
        self.etcd = etcd
        self.keys = keys
        self.alloc = alloc
        self.dp = dp
        self.pods = pods
        self.nets = nets
        self.sync = sync
        self.sessions = sessions
        self.lease_id = lease_id
        #: containers.Containers.adopt (set by the agent; None: containers are removed)
        self.adopt_container: Callable[[str], Pod | None] | None = None

    # -- at start ----------------------------------------------------------------------
    def reconcile(self) -> None:
        self.sessions.load()
        for name in self.dp.remove_stale_files():
            log.info("reconcile: removed the stale pod file %s", name)
        for name in self.dp.pod_netns_names():
            try:
                pod = self.adopt(name)
            except Exception:
                log.exception("reconcile: cannot adopt %s", name)
                pod = None
            if pod is None:
                log.info("reconcile: removing orphan pod %s", name)
                self.dp.remove_pod(name, None)
                continue
            self.pods.add(pod)
        pods = self.pods.all()
        # routes to pods that are gone, users with a bridge and no pod
        self.dp.remove_pod_routes_except({p.ip for p in pods})
        vnis = {p.vni for p in pods}
        self.nets.remove_unused(vnis)
        # the host network stays as it was (links of an older podnetd had addresses);
        # removing a link's last IPv4 address drops its routes: the pods' /32 come back
        removed = self.dp.scrub_host_links()
        if removed:
            log.info("reconcile: removed %d addresses from podnet links", removed)
        self.dp.set_pod_routes({p.ip: p.vni for p in pods})
        self.nets.register_vteps(vnis)
        self.sync.resync_firewall()

    def adopt(self, name: str) -> Pod | None:
        veth = "" if is_container_ns(name) else self.dp.pod_veth(name) or ""
        if name.startswith("pn-j") and name[4:].isdigit():
            return self._adopt_job(name, veth)
        if name.startswith("pn-l") and name[4:].isdigit():
            return self._adopt_login(name, veth)
        if is_container_ns(name) and self.adopt_container is not None:
            return self.adopt_container(name)
        return None

    def _adopt_job(self, name: str, veth: str) -> Pod | None:
        job = self.alloc.get_job(int(name[4:]))
        if job is None or self.cfg.node not in job.nodes:
            return None
        i = job.nodes.index(self.cfg.node)
        if not veth or self._pod_ip(name) != job.ips[i]:
            return None  # half-built (the agent died while creating it): rebuild on demand
        self.alloc.publish_pod(job, i, self.cfg.node)
        return Pod.of_job(job, i, name, str(self.dp.netns_path(name)), self.cc, veth)

    def _adopt_login(self, name: str, veth: str) -> Pod | None:
        uid = int(name[4:])
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            return None
        kv = self.etcd.get(self.keys.login(self.cfg.node, user))
        ip = str(kv.json()["ip"]) if kv else self._pod_ip(name)
        if not ip:
            return None
        vni = self.alloc.user_vni(user, uid)
        pod = Pod.of_login(
            self.cfg.node, user, uid, ip, vni, name, str(self.dp.netns_path(name)), self.cc, veth
        )
        self.republish_login(pod)
        return pod

    def republish_login(self, p: Pod) -> None:
        self.etcd.put_many(
            self.alloc.login_record_ops(self.cfg.node, p.user, p.uid, p.vni, p.ip, self.lease_id())
        )

    def after_lease_loss(self) -> None:
        """VTEPs and login records again, on the new lease."""
        pods = self.pods.all()
        self.nets.register_vteps({p.vni for p in pods})
        for p in pods:
            if p.kind == "login":
                self.republish_login(p)

    def _pod_ip(self, name: str) -> str | None:
        try:
            sock = self.dp.host.run_in(self.dp.netns_path(name), nl.Netlink)
        except OSError:
            return None
        try:
            return nl.first_ipv4(sock, "eth0")
        finally:
            sock.close()

    # -- while running -------------------------------------------------------------------
    def live_jobs(self) -> set[int] | None:
        """Job ids Slurm knows (None when the job source cannot answer)."""
        try:
            out = subprocess.run(
                self.cfg.job_source, capture_output=True, text=True, timeout=30, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("job source %s: %s", self.cfg.job_source[0], e)
            return None
        return parse_job_ids(out)

    def gc_once(self, job_down: Callable[[int], object]) -> list[int]:
        """Remove job pods whose job Slurm no longer knows; returns their ids."""
        jobs = [(p.job_id, p.created) for p in self.pods.all() if p.kind == "job"]
        live = self.live_jobs()
        if live is None:
            return []
        now = time.time()
        gone = [
            j
            for j, created in jobs
            if j is not None and j not in live and now - created > GC_MIN_POD_AGE
        ]
        for j in gone:
            log.info("GC: job %d is gone, removing its pod", j)
            job_down(j)
        self.gc_records(live)
        return gone

    def gc_records(self, live: set[int]) -> list[int]:
        """Release etcd records of jobs Slurm no longer knows (nodes that died)."""
        kvs = self.etcd.get_prefix(self.keys.prefix("jobs"))[0]
        out = []
        for kv in kvs:
            job = Job.from_json(kv.json(), kv.mod_revision)
            if job.job_id not in live and time.time() - job.created > GC_MIN_RECORD_AGE:
                self.alloc.release_job(job)
                out.append(job.job_id)
        return out

    def run_gc(self, stop: threading.Event, job_down: Callable[[int], object]) -> None:
        while not stop.wait(self.cfg.gc_interval):
            try:
                self.gc_once(job_down)
            except Exception:
                log.exception("GC failed")


def parse_job_ids(out: str) -> set[int]:
    """Job ids in the job source's output (`squeue -h -o %i` style: `123`, `123_4`
    array tasks, `123+1` heterogeneous components)."""
    ids = set()
    for tok in out.split():
        base = tok.split("_")[0].split("+")[0]
        if base.isdigit():
            ids.add(int(base))
    return ids
