# SPDX-License-Identifier: Apache-2.0
"""Kernel state against etcd: adopt at start, collect garbage while running.

At start (`reconcile`), every pod netns left by an earlier podnetd is adopted if etcd
still says it belongs here (a live pod is never torn down because the daemon
restarted), else removed; then routes, bridges and firewall entries with no pod are
removed. While running (`gc_once`, every `gc_interval`), job pods whose job Slurm no
longer knows are removed, and job records of jobs that ended on nodes that died are
released: by one node at a time (`records_gc_turn`: the node `gc/records` names, a key on
a lease of its own that node keeps alive each round, taken by the first node to find it
gone), since no node follows every job's record (a job start would otherwise reach every
node of the cluster).

A job pod whose job record etcd lost (etcd restored to a snapshot older than the job) is
kept if Slurm still runs the job (`running_job_source`) and this node has its own copy of
the pod (`localjobs.LocalJobs`): its records (the job's record, VNI, name, this pod's
address and DNS names) are written back with the same address (`Allocator.reclaim_job`,
which never takes what another owner holds; the pod stays and it is retried every GC until
it can). Each node of the job writes back its own pod.
A pod whose job no longer runs is removed, never brought back.
"""

from __future__ import annotations

import logging
import pwd
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from podnet.config import ClusterConfig, NodeConfig
from podnet.kernel import nl, nlquery
from podnet.kernel.dataplane import Dataplane
from podnet.kernel.firewall import Firewall
from podnet.names import Keys
from podnet.names import is_container_netns as is_container_ns
from podnet.node.localjobs import LocalJobs
from podnet.node.pods import Pod, PodTable
from podnet.node.sessions import LoginSessions
from podnet.node.usernets import UserNetworks
from podnet.state import quota
from podnet.state.alloc import Allocator, AllocError, JobPod
from podnet.state.clusterview import ClusterView
from podnet.state.etcdops import cmp_absent, op_get, op_put
from podnet.state.store import Etcd, EtcdRequestError, EtcdUnavailable
from podnet.state.watchrecords import job_of, json_object

log = logging.getLogger("podnet.reconcile")

#: a job pod younger than this is never collected (Slurm may not list its job yet)
GC_MIN_POD_AGE = 5.0
#: job records of jobs Slurm forgot are released after this many seconds
GC_MIN_RECORD_AGE = 60.0


def records_gc_ttl(gc_interval: float) -> int:
    """The TTL of `gc/records`'s lease: two GC rounds and some (its node keeps it alive
    once a round)."""
    return int(2 * gc_interval) + 30


class Reconciler:
    def __init__(
        self,
        cfg: NodeConfig,
        cc: ClusterConfig,
        etcd: Etcd,
        keys: Keys,
        alloc: Allocator,
        dp: Dataplane,
        fw: Firewall,
        pods: PodTable,
        nets: UserNetworks,
        view: ClusterView,
        sessions: LoginSessions,
        lease_id: Callable[[], int],
        adopt_container: Callable[[str], Pod | None] | None = None,
    ) -> None:
        """`adopt_container`: containers.Containers.adopt (None: containers are removed)."""
        self.cfg = cfg
        self.cc = cc
        self.etcd = etcd
        self.keys = keys
        self.alloc = alloc
        self.dp = dp
        self.fw = fw
        self.pods = pods
        self.nets = nets
        self.view = view
        self.sessions = sessions
        self.lease_id = lease_id
        self.adopt_container = adopt_container
        #: this node's copy of the job record of each of its job pods
        self.local = LocalJobs(Path(cfg.state_dir))
        #: job pods kept whose records etcd lost, not yet written back (netns -> record)
        self.unclaimed: dict[str, JobPod] = {}
        #: the running jobs, asked once per start (None: Slurm did not answer)
        self._running_at_start: set[int] | None = None
        self._running_asked = False
        #: one collection or write back at a time (the GC loop, reclaim_soon)
        self._gc_lock = threading.Lock()

    # -- at start ----------------------------------------------------------------------
    def reconcile(self) -> None:
        self._running_asked = False
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
        self.fw.resync(self.view.node_addresses(), self.pods.fw_ports())

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
        job_id = int(name[4:])
        mine = self.alloc.get_pod(job_id, self.cfg.node)
        if mine is None:  # etcd lost the job's record or this node's pod of it
            return self._adopt_lost_job(job_id, name, veth)
        if not veth or self._pod_ip(name) != mine.ip:
            return None  # half-built (the agent died while creating it): rebuild on demand
        self.alloc.publish_pod(mine)
        self.alloc.ipam.mark([mine.ip])
        self.local.save(mine)
        return Pod.of_job(mine, name, str(self.dp.netns_path(name)), self.cc, veth)

    def _adopt_lost_job(self, job_id: int, name: str, veth: str) -> Pod | None:
        """A job pod etcd knows nothing of (no record of the job, or none of this node's
        pod): kept (to be written back by `reclaim_lost`) if this node has its copy, the
        pod is whole and Slurm may still run the job."""
        mine = self.local.load(job_id, self.cfg.node)
        if mine is None:
            log.info("reconcile: job %d is unknown to etcd and to this node", job_id)
            return None
        if not veth or self._pod_ip(name) != mine.ip:
            self.local.drop(job_id)
            return None
        if not self._running_asked:
            self._running_at_start = self.running_jobs()
            self._running_asked = True
        what = decide_lost_pod(job_id, self._running_at_start)
        if what == "remove":
            log.info("reconcile: job %d is unknown to etcd and no longer runs", job_id)
            self.local.drop(job_id)
            return None
        log.warning(
            "reconcile: etcd lost the records of job %d (restored to an older snapshot?), "
            "%s: keeping its pod %s %s",
            job_id,
            "which runs" if what == "keep" else "maybe running (asked again)",
            name,
            mine.ip,
        )
        self.unclaimed[name] = mine
        self.alloc.ipam.mark([mine.ip])  # never handed out here meanwhile
        return Pod.of_job(mine, name, str(self.dp.netns_path(name)), self.cc, veth)

    def reclaim_lost(self, job_down: Callable[[int], object]) -> list[int]:
        """Write back the records of the kept pods whose records etcd lost; remove those
        whose job no longer runs. Returns the jobs written back."""
        if not self.unclaimed:
            return []
        running = self.running_jobs()
        done = []
        for name, mine in list(self.unclaimed.items()):
            job = mine.job
            what = decide_lost_pod(job.job_id, running)
            if what == "wait":
                log.warning("job %d: cannot tell whether it runs: its pod waits", job.job_id)
                continue
            if what == "remove":
                log.info("job %d no longer runs: removing its pod (not written back)", job.job_id)
                self.unclaimed.pop(name, None)
                job_down(job.job_id)
                continue
            live = running or set()
            try:
                got = self.alloc.reclaim_job(mine, live.__contains__)
                self.alloc.publish_pod(got)
            except AllocError as e:
                log.error(
                    "job %d: its records cannot be written back: %s (its pod %s keeps %s "
                    "and works on this node; retried every GC)",
                    job.job_id,
                    e,
                    name,
                    mine.ip,
                )
                continue
            except (EtcdUnavailable, EtcdRequestError) as e:
                log.warning("job %d: writing its records back: %s (retried)", job.job_id, e)
                continue
            self.unclaimed.pop(name, None)
            self.local.save(got)
            self.nets.register_vteps({got.job.vni})
            log.warning(
                "job %d: records written back after etcd lost them; pod %s keeps %s",
                job.job_id,
                name,
                mine.ip,
            )
            done.append(job.job_id)
        return done

    def find_lost(self, recorded: set[int], min_age: float = GC_MIN_POD_AGE) -> list[int]:
        """Job pods here (older than `min_age`) whose job record is not among `recorded`
        (etcd lost it while podnetd ran, or another writer deleted it): kept for
        `reclaim_lost`."""
        now = time.time()
        out = []
        for p in self.pods.all():
            if (
                p.kind != "job"
                or p.job_id is None
                or p.job_id in recorded
                or p.name in self.unclaimed
                or now - p.created <= min_age
            ):
                continue
            mine = self.local.load(p.job_id, self.cfg.node)
            if mine is None or mine.ip != p.ip:
                continue
            log.warning("job %d: etcd lost its records: writing them back", p.job_id)
            self.unclaimed[p.name] = mine
            out.append(p.job_id)
        return out

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
        pod.slots = quota.slots_of(kv.json()) if kv else {}
        self.republish_login(pod)
        return pod

    def republish_login(self, p: Pod) -> None:
        p.slots = self.alloc.republish_login(
            self.cfg.node, p.user, p.uid, p.vni, p.ip, self.lease_id(), p.slots
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
            return nlquery.first_ipv4(sock, "eth0")
        finally:
            sock.close()

    # -- while running -------------------------------------------------------------------
    def live_jobs(self) -> set[int] | None:
        """Job ids Slurm knows (None when the job source cannot answer)."""
        return _job_ids(self.cfg.job_source)

    def running_jobs(self) -> set[int] | None:
        """Job ids Slurm runs (None when it cannot answer)."""
        return _job_ids(self.cfg.running_job_source)

    def reclaim_soon(self, job_down: Callable[[int], object]) -> None:
        """A job with a pod here lost its record (another writer deleted it; the record
        guard saw it): write it back now (if Slurm runs the job), not at the next GC."""

        def run() -> None:
            try:
                with self._gc_lock:
                    self.find_lost(self.own_recorded(), min_age=0.0)
                    self.reclaim_lost(job_down)
            except Exception:
                log.exception("writing a job's records back failed (the GC tries again)")

        threading.Thread(target=run, name="reclaim", daemon=True).start()

    def own_recorded(self) -> set[int]:
        """The jobs with a pod here whose record etcd holds (read in transactions of at
        most etcd's --max-txn-ops reads)."""
        ids = sorted({p.job_id for p in self.pods.all() if p.kind == "job" and p.job_id})
        size = max(1, self.etcd.max_txn_ops)
        out: set[int] = set()
        for i in range(0, len(ids), size):
            chunk = ids[i : i + size]
            r = self.etcd.txn([], [op_get(self.keys.job(j)) for j in chunk])
            out.update(j for k, j in enumerate(chunk) if r.range_kvs(k))
        return out

    def records_gc_turn(self) -> bool:
        """Whether this node releases the records of jobs whose nodes died, this round:
        the node `gc/records` names. The key is on a lease of its own (not the node's: a
        put on a lease needs the right to write every key on it, which an earlier podnetd
        after a downgrade lacks), which its node keeps alive each round, so the key goes
        `records_gc_ttl` seconds after that node stops; a node that finds it gone takes it.
        One cheap read per round on every node, a keepalive by the one named."""
        key = self.keys.records_gc
        kv = self.etcd.get(key, serializable=True)
        if kv is not None:
            d = json_object(kv)
            lease = d.get("lease")
            if d.get("node") != self.cfg.node or not isinstance(lease, int):
                return False
            return self.etcd.lease_keepalive(lease) > 0
        lease = self.etcd.lease_grant(records_gc_ttl(self.cfg.gc_interval))
        value = {"node": self.cfg.node, "lease": lease}
        if not self.etcd.txn([cmp_absent(key)], [op_put(key, value, lease)]).succeeded:
            self.etcd.lease_revoke(lease)
            return False
        log.info("this node now releases the records of jobs whose nodes died")
        return True

    def gc_once(self, job_down: Callable[[int], object]) -> list[int]:
        """Remove job pods whose job Slurm no longer knows; returns their ids."""
        with self._gc_lock:
            return self._gc_once(job_down)

    def _gc_once(self, job_down: Callable[[int], object]) -> list[int]:
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
        try:
            if self.records_gc_turn():
                self.gc_records(live)
        except (EtcdUnavailable, EtcdRequestError) as e:  # this node's own pods still go on
            log.warning("GC of dead jobs' records: %s (next round)", e)
        self.find_lost(self.own_recorded())
        self.reclaim_lost(job_down)
        return gone

    def gc_records(self, live: set[int]) -> list[int]:
        """Release etcd records of jobs Slurm no longer knows (nodes that died); returns
        the jobs released."""
        kvs = self.etcd.get_prefix(self.keys.prefix("jobs"))[0]
        now, out = time.time(), []
        for job in (j for kv in kvs if (j := job_of(kv)) is not None):
            if job.job_id not in live and now - job.created > GC_MIN_RECORD_AGE:
                self.alloc.release_job(job)
                out.append(job.job_id)
        return out

    def run_gc(self, stop: threading.Event, job_down: Callable[[int], object]) -> None:
        while not stop.wait(self.cfg.gc_interval):
            try:
                self.gc_once(job_down)
            except Exception:
                log.exception("GC failed")


def decide_lost_pod(job_id: int, running: set[int] | None) -> str:
    """What to do with a pod whose job records etcd lost: 'keep' (write them back) if the
    job runs, 'remove' if it does not, 'wait' if nobody can tell (kept, asked again)."""
    if running is None:
        return "wait"
    return "keep" if job_id in running else "remove"


def _job_ids(argv: list[str]) -> set[int] | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("job source %s: %s", argv[0], e)
        return None
    return parse_job_ids(out)


def parse_job_ids(out: str) -> set[int]:
    """Job ids in the job source's output (`squeue -h -o %i` style: `123`, `123_4`
    array tasks, `123+1` heterogeneous components)."""
    ids = set()
    for tok in out.split():
        base = tok.split("_")[0].split("+")[0]
        if base.isdigit():
            ids.add(int(base))
    return ids
