# SPDX-License-Identifier: Apache-2.0
"""The node agent: the operations the socket server calls, on the node's pod network plane
(`plane.NodePlane`, built by `start`: components that each own one thing, testable alone):

* `pods.PodTable` / `pods.PodWiring`: this node's pods; one pod into the kernel and out;
* `usernets.UserNetworks`: per-user bridge and VXLAN, the per-user lock, the linger;
* `state.clusterview.ClusterView`: what the watches say; `workqueue.SyncQueue`: the sync
  loop's work;
* `etcd_sync.EtcdSync`: etcd watches -> the view -> IPAM view, routes, FDB, firewall sets;
* `repair.RecordRepair` / `repair.RecordGuard`: what another writer changed, written back;
* `sessions.LoginSessions`: which processes hold each login pod; `NodeLease`: the lease;
* `reconcile.Reconciler`: adopt at start, garbage collection while running;
* `containers.Containers`: containers on their owner's network (the CNI plugin);
* `quotaview.QuotaView`: whom the quotas limit, a login pod's limits, a user's usage.

Operations are idempotent: `job_up` twice returns the same pod, `job_down` of a missing
job is a no-op. Work for one user is serialized by that user's lock; the pod table's
lock is held only around table updates, never across etcd, netlink or nftables calls.
The cluster's `failure_policy` decides what a request does when etcd is unreachable:
`fail` answers EUNAVAIL at once (the job fails with that message), `retry` retries for
`failure_retry_seconds` first.
"""

from __future__ import annotations

import contextlib
import logging
import pwd
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, TypeVar

from podnet import __version__
from podnet.config import ClusterConfig, ConfigError, NodeConfig
from podnet.errors import PodnetError
from podnet.kernel.dataplane import NewNetns
from podnet.kernel.pidns import PidnsError
from podnet.names import Keys, job_label, job_netns, login_netns
from podnet.node.containers import Containers
from podnet.node.plane import NodePlane
from podnet.node.pods import Pod, PodTable, job_search, search_of
from podnet.node.quotaview import QuotaView
from podnet.node.sessions import LoginSessions
from podnet.state import publish, quota
from podnet.state.alloc import AllocError, JobPod
from podnet.state.store import Etcd, EtcdRequestError, EtcdUnavailable
from podnet.stats import ETCD_BUCKETS, Histogram

__all__ = ["Agent", "Pod", "PodnetError"]

log = logging.getLogger("podnet.agent")
T = TypeVar("T")

#: first and longest pause between attempts under failure_policy retry (seconds)
RETRY_FIRST, RETRY_MAX = 0.25, 2.0


class Agent:
    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.keys = Keys(cfg.cluster)
        self.etcd_seconds = Histogram(ETCD_BUCKETS)
        self.watch_seconds = Histogram(ETCD_BUCKETS)
        self.etcd = Etcd.of_node(
            cfg, observe=self.etcd_seconds.observe, observe_watch=self.watch_seconds.observe
        )
        self.state = Path(cfg.state_dir)
        self.stop = threading.Event()
        self.pods = PodTable()
        self.sessions = LoginSessions(self.state)
        self.setup_seconds = Histogram()
        # work that overlaps with the request thread's (job_up: 4 tasks per pod)
        self.pool = ThreadPoolExecutor(max_workers=6, thread_name_prefix="etcd")
        self._plane: NodePlane | None = None
        #: the quotas (the cluster configuration's, followed while running)
        self.quotas = quota.LiveLimits(self.etcd, self.keys)
        self.quota = QuotaView(cfg, self.quotas, self.etcd, self.keys)

    @property
    def plane(self) -> NodePlane:
        if self._plane is None:
            raise RuntimeError("agent not started")
        return self._plane

    @property
    def cluster(self) -> ClusterConfig:
        return self.plane.cc

    @property
    def containers(self) -> Containers:
        """container_add/del/check (the podnet CNI plugin, podnet-container)."""
        return self.plane.containers

    # -- start ---------------------------------------------------------------------------
    def load_cluster_config(self) -> ClusterConfig:
        try:
            data = self.etcd.get_json(self.keys.config)
        except (EtcdUnavailable, EtcdRequestError) as e:
            raise ConfigError(f"etcd: {e}") from None
        except ValueError:
            raise ConfigError(f"etcd key {self.keys.config} is not JSON") from None
        if data is None:
            raise ConfigError(
                f"etcd key {self.keys.config} is missing (the collection "
                "writes it: hpc.podnet.agent)"
            )
        where = f"etcd {self.keys.config}"
        if isinstance(data, dict) and (extra := ClusterConfig.unknown_settings(data)):
            log.warning(
                "%s: setting(s) %s are unknown to this podnetd (written by a newer podnet, "
                "before this node's upgrade): ignored",
                where,
                ", ".join(extra),
            )
        return ClusterConfig.from_dict(data, where, strict=False)

    def start(self) -> None:
        cfg = self.cfg
        cc = self.load_cluster_config()
        self.quotas.set(quota.Limits.of(cc))
        self.state.mkdir(parents=True, exist_ok=True)
        Path(cfg.resolv_dir).mkdir(parents=True, exist_ok=True)
        plane = self._plane = NodePlane.build(
            cfg, cc, self.etcd, self.pods, self.sessions, self.quotas.get, self.job_down
        )
        with contextlib.suppress(OSError):
            Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        plane.lease.register()
        rev = plane.sync.resync()  # the views now; the sync loop's first pass does the rest
        plane.sync.refresh_nodes()
        plane.reconcile.reconcile()
        plane.containers.release_unadopted()
        plane.reconcile.reclaim_lost(self.job_down)
        plane.sync.sync_routes()
        plane.sync.watch(rev, self.stop)
        loops: list[tuple[str, Callable[[], None]]] = [
            ("lease", lambda: plane.lease.run(self.stop, plane.reconcile.after_lease_loss)),
            ("sync", lambda: plane.sync.run(self.stop)),
            ("overlay", lambda: plane.overlay.run(self.stop)),
            ("sessions", self._session_loop),
            ("gc", lambda: plane.reconcile.run_gc(self.stop, self.job_down)),
            ("linger", lambda: plane.nets.run(self.stop)),
            ("containers", lambda: plane.containers.run(self.stop)),
            ("guard", lambda: plane.guard.run(self.stop)),
        ]
        for name, target in loops:
            threading.Thread(target=target, name=name, daemon=True).start()

    # -- failure policy ------------------------------------------------------------------
    def per_policy(self, what: str, attempt: Callable[[], T]) -> T:
        """`attempt()`; under failure_policy retry, again while etcd is unreachable, for
        up to failure_retry_seconds (every attempt is idempotent)."""
        cc = self.cluster
        if cc.failure_policy != "retry":
            return attempt()
        deadline = time.monotonic() + cc.failure_retry_seconds
        pause = RETRY_FIRST
        while True:
            try:
                return attempt()
            except EtcdUnavailable as e:
                left = deadline - time.monotonic()
                if left <= 0 or self.stop.is_set():
                    raise
                log.warning("%s: %s; failure_policy retry: %.0f s left", what, e, left)
                time.sleep(min(pause, left))
                pause = min(pause * 2, RETRY_MAX)

    # -- job pods ------------------------------------------------------------------------
    def job_up(
        self, job_id: int, user: str, uid: int, job_name: str, nodes: list[str], node_index: int
    ) -> Pod:
        if nodes[node_index] != self.cfg.node:
            raise PodnetError(
                "EINVAL",
                f"nodes[{node_index}] is {nodes[node_index]!r}, this node is {self.cfg.node!r}",
            )
        t0 = time.monotonic()
        pod, new = self.per_policy(
            f"job {job_id}",
            lambda: self._job_up(job_id, user, uid, job_name, nodes, node_index),
        )
        if new:
            self.setup_seconds.observe(time.monotonic() - t0)
        return pod

    def _job_up(
        self, job_id: int, user: str, uid: int, job_name: str, nodes: list[str], node_index: int
    ) -> tuple[Pod, bool]:
        """(the job's pod here, whether this call made it)"""
        r = self.plane
        name = job_netns(job_id)
        with r.nets.lock(uid):
            pod = self.pods.get(name)
            if pod is not None:
                if pod.user != user:
                    raise PodnetError("EPERM", f"job {job_id} belongs to another user")
                return pod, False
            vni, bri = r.nets.ensure(user, uid)
            # while this thread allocates (the allocation's round trips to etcd), a worker
            # makes the empty netns and its veth, another the resolv.conf the request's job
            # name gives (the record's, if it differs): both are file system and kernel
            # work, which runs outside the GIL
            search = search_of(job_label(job_name), job_id, user, r.cc.zone)
            making = self.pool.submit(r.wiring.new_netns, name, bri)
            resolving = self.pool.submit(r.wiring.prepare_resolv, name, search)
            # the pod's record under the job name (one more small transaction) goes to
            # etcd while the pod is wired
            later: list[Callable[[], None]] = []
            try:
                mine = r.alloc.allocate_job(
                    job_id, user, uid, job_name, nodes, vni, node_index, later
                )
                if mine.job.user != user:
                    raise PodnetError("EPERM", f"job {job_id} belongs to another user")
            except BaseException as e:
                wait(_futures(making, resolving))
                if making.exception() is None:
                    r.dp.discard(making.result())
                else:
                    r.wiring.drop_resolv(name, making.exception())
                if isinstance(e, AllocError):
                    raise PodnetError("EINVAL", str(e)) from None
                raise
            pod = self._wire_job_pod(mine, name, making, resolving, later)
            self.pods.add(pod)
        log.info("job %d: pod %s %s for %s", job_id, name, pod.ip, user)
        return pod, True

    def _wire_job_pod(
        self,
        mine: JobPod,
        name: str,
        making: Future[NewNetns],
        resolving: Future[tuple[list[str], list[str]]],
        later: list[Callable[[], None]],
    ) -> Pod:
        """`_job_up` once the job is allocated: the pod wired into the namespace `making`
        made (with the resolv.conf `resolving` wrote), while workers send `later` to etcd
        and write this node's copy of the record."""
        r, job, job_id = self.plane, mine.job, mine.job.job_id
        naming: Future[None] = self.pool.submit(_run_all, later) if later else _done()
        # what a restore to an older etcd snapshot needs to keep the pod, written (disk)
        # while the pod is wired
        saving = self.pool.submit(r.reconcile.local.save, mine)
        wait(_futures(making, resolving))
        try:
            ns = making.result()
        except BaseException as e:
            wait([saving, naming])
            r.reconcile.local.drop(job_id)
            r.wiring.drop_resolv(name, e)
            raise
        if resolving.exception() is None:  # else wire_pod writes it (or fails)
            ns.resolv = resolving.result()
        pod = Pod.of_job(mine, name, str(r.dp.netns_path(name)), r.cc)
        # this node's allocation wrote the pod's DNS records and marker already
        try:
            r.wiring.build(pod, job_search(job, r.cc.zone), ns)
        except BaseException:
            wait([saving, naming])
            r.reconcile.local.drop(job_id)
            with contextlib.suppress(EtcdUnavailable, EtcdRequestError):
                r.alloc.unpublish_pod(mine)
            raise
        try:
            naming.result()
        except BaseException:
            wait([saving])
            r.reconcile.local.drop(job_id)
            r.wiring.unbuild(pod)
            with contextlib.suppress(EtcdUnavailable, EtcdRequestError):
                r.alloc.unpublish_pod(mine)
            raise
        try:
            saving.result()
        except OSError as e:
            log.warning("job %d: cannot keep its record in %s: %s", job_id, self.state, e)
        return pod

    def job_down(self, job_id: int) -> bool:
        r = self.plane
        name = job_netns(job_id)
        pod = self.pods.pop(name)
        r.reconcile.unclaimed.pop(name, None)
        existed = r.wiring.remove(name, pod)
        mine = r.reconcile.local.load(job_id, self.cfg.node)
        r.reconcile.local.drop(job_id)

        def leave() -> None:
            left = mine if mine is not None else r.alloc.get_pod(job_id, self.cfg.node)
            if left is not None:
                r.alloc.leave_job(left)

        self.per_policy(f"job {job_id}", leave)
        if pod:
            with r.nets.lock(pod.uid):
                r.nets.release(pod.vni, pod.uid)
        return existed or pod is not None

    def job_pidns(self, job_id: int, pid: int) -> bool:
        """Adopt Slurm's PID namespace of the job (PID 1 `pid`) as its pod's (pidns.py)."""
        name = job_netns(job_id)
        self.job_get(job_id)
        pidns = self.plane.dp.pidns
        if pidns is None:
            return False
        try:
            return pidns.adopt(name, pid)
        except PidnsError as e:
            raise PodnetError("EINVAL", f"job {job_id}: {e.strerror or e}") from None

    def job_get(self, job_id: int) -> Pod:
        pod = self.pods.get(job_netns(job_id))
        if pod is None:
            raise PodnetError("ENOENT", f"job {job_id} has no pod on this node")
        return pod

    # -- login pods ----------------------------------------------------------------------
    def login_acquire(self, uid: int, pid: int) -> Pod:
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            raise PodnetError("EINVAL", f"uid {uid} has no user name") from None
        pod = self.per_policy(f"login of {user}", lambda: self._login_pod(user, uid))
        if pid > 0:
            self.sessions.add(uid, pid)
        return pod

    def _login_pod(self, user: str, uid: int) -> Pod:
        r = self.plane
        name = login_netns(uid)
        with r.nets.lock(uid):
            pod = self.pods.get(name)
            if pod is not None:
                return pod
            vni, bri = r.nets.ensure(user, uid)
            try:
                ip, slots = r.alloc.allocate_login(
                    self.cfg.node, user, uid, vni, r.lease.id, self.quota.login_limits(uid)
                )
            except AllocError as e:
                r.nets.release(vni, uid)
                raise PodnetError("EUNAVAIL", str(e)) from None
            except BaseException:
                r.nets.release(vni, uid)
                raise
            pod = Pod.of_login(
                self.cfg.node, user, uid, ip, vni, name, str(r.dp.netns_path(name)), r.cc
            )
            pod.slots = slots
            r.wiring.build(pod, [f"{user}.{r.cc.zone}"], r.wiring.new_netns(name, bri))
            self.pods.add(pod)
        return pod

    # -- quotas (state/quota.py, node/quotaview.py) ------------------------------------
    def quota_usage(self, uid: int) -> dict[str, Any]:
        """What `uid` holds against each quota (`podnet status`)."""
        return self.quota.usage(uid, lambda: self.plane.alloc.slots, self.pods)

    def login_release(self, uid: int) -> bool:
        r = self.plane
        name = login_netns(uid)
        with r.nets.lock(uid):
            pod = self.pods.pop(name)
            self.sessions.drop(uid)
            existed = r.wiring.remove(name, pod)
            if pod:
                r.alloc.release_login(self.cfg.node, pod.user)
                r.nets.release(pod.vni, pod.uid)
        return existed or pod is not None

    def _session_loop(self) -> None:
        while not self.stop.wait(1.0):
            logins = [p.uid for p in self.pods.all() if p.kind == "login"]
            for uid in self.sessions.due(time.monotonic(), logins, self.cluster.login_grace):
                log.info("uid %d: no session left, releasing the login pod", uid)
                try:
                    self.login_release(uid)
                except Exception:
                    log.exception("releasing the login pod of uid %d failed", uid)

    # -- queries -------------------------------------------------------------------------
    def join(self, uid: int, target: str, job_id: int | None) -> Pod:
        if target == "login":
            pod = self.pods.get(login_netns(uid))
            if pod is None:
                raise PodnetError("ENOENT", "no login pod: use login_acquire")
            return pod
        if job_id is not None:
            pod = self.pods.get(job_netns(job_id))
            if pod is None:
                raise PodnetError("ENOENT", f"job {job_id} has no pod on this node")
            if pod.uid != uid:
                raise PodnetError("EPERM", f"job {job_id} is not yours")
            return pod
        mine = [p for p in self.pods.all(uid) if p.kind == "job"]
        if not mine:
            raise PodnetError("ENOENT", "you have no job on this node")
        return max(mine, key=lambda p: (p.created, p.job_id or 0))

    def list_pods(self, uid: int | None) -> list[Pod]:
        return self.pods.all(uid)

    # -- published ports (podnet publish; docs/gateway.md) -------------------------------
    def publish(self, uid: int, root: bool, job: str, pod: int, port: int) -> dict[str, Any]:
        return publish.publish(self.etcd, self.keys, uid, root, job, pod, port)

    def unpublish(self, uid: int, root: bool, job: str, pod: int, port: int) -> int:
        return publish.unpublish(self.etcd, self.keys, uid, root, job, pod, port)

    def published(self, uid: int | None) -> list[dict[str, Any]]:
        """The published ports (of `uid`; None: all), each with its external address."""
        try:
            ext_ip = publish.gateway_config(self.etcd, self.keys)[0]
        except PodnetError:
            ext_ip = ""
        recs = publish.list_published(self.etcd, self.keys, uid)
        for r in recs:
            r["address"] = f"{ext_ip}:{r['external_port']}"
        return recs

    def status(self) -> dict[str, Any]:
        try:
            st = self.etcd.status()
            etcd = {"ok": True, "version": st.get("version"), "leader": st.get("leader")}
        except (EtcdUnavailable, EtcdRequestError) as e:
            etcd = {"ok": False, "error": str(e)}
        pods = self.pods.all()
        return {
            "node": self.cfg.node,
            "etcd": etcd,
            "pods": len(pods),
            "users": len({p.uid for p in pods}),
            "version": __version__,
            "cluster": self.cfg.cluster,
        }

    @property
    def pool_blocks(self) -> tuple[int, int]:
        """(blocks of the pod network taken, blocks in it), cluster-wide as this node's watch
        of etcd sees them (metrics; (0, 0) until the cluster configuration is known)."""
        if self._plane is None:
            return 0, 0
        ipam = self._plane.alloc.ipam
        with ipam.lock:
            return len(ipam.blocks), ipam.n_blocks

    @property
    def records_restored(self) -> int:
        """The records the guard wrote back since podnetd started (metrics)."""
        return self._plane.guard.restored if self._plane is not None else 0

    @property
    def overlay_misses(self) -> tuple[int, int, int]:
        """The VXLANs' misses, remote pods resolved, misses dropped (metrics)."""
        if self._plane is None:
            return 0, 0, 0
        o = self._plane.overlay
        return o.misses, o.resolutions, o.dropped

    def shutdown(self) -> None:
        self.stop.set()
        self.pool.shutdown(wait=False)
        if self._plane is not None:
            self._plane.lease.withdraw()
            self._plane.dp.close()


def _futures(*fs: Future[Any]) -> list[Future[Any]]:
    """Futures of different result types as one list for `wait` (a list literal of them
    types as list[object])."""
    return list(fs)


def _run_all(steps: list[Callable[[], None]]) -> None:
    for run in steps:
        run()


def _done() -> Future[None]:
    f: Future[None] = Future()
    f.set_result(None)
    return f
