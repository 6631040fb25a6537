"""The node agent: pods of this node, built from etcd allocations, kept in sync.

Public operations (called by the socket server after authorization) are idempotent:
`job_up` twice returns the same pod, `job_down` of a missing job is a no-op.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import pwd
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from podnet import __version__, nl
from podnet.alloc import Allocator, AllocError, Job
from podnet.config import ClusterConfig, ConfigError, NodeConfig
from podnet.dataplane import Dataplane, NewNetns, PodSpec
from podnet.firewall import Firewall
from podnet.ipam import Ipam
from podnet.metrics import Histogram
from podnet.names import Keys, block_from_key, job_netns, login_label, login_netns
from podnet.store import Etcd, EtcdRequestError, EtcdUnavailable, op_put

log = logging.getLogger("podnet.agent")
T = TypeVar("T")


class PodnetError(Exception):
    """An error with an API code (docs/api.md)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Pod:
    kind: str  # job | login
    name: str
    netns: str
    ip: str
    prefix: int
    user: str
    uid: int
    vni: int
    job_id: int | None = None
    index: int | None = None
    names: list[str] = field(default_factory=list)
    veth: str = ""
    created: float = field(default_factory=time.time)

    def public(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("veth", None)
        d.pop("vni", None)
        return d


class Agent:
    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.keys = Keys(cfg.cluster)
        self.etcd = Etcd(
            cfg.etcd_endpoints, cfg.etcd_ca, cfg.etcd_cert, cfg.etcd_key, cfg.etcd_timeout
        )
        self._cluster: ClusterConfig | None = None
        self.pods: dict[str, Pod] = {}
        self.lock = threading.RLock()  # pods table
        self.job_locks: dict[str, threading.Lock] = {}
        self.user_locks: dict[int, threading.Lock] = {}
        self.sessions: dict[int, dict[int, int]] = {}  # uid -> {pid: starttime}
        self.idle_since: dict[int, float] = {}
        self.stop = threading.Event()
        self.lease = 0
        self.vteps: dict[int, set[str]] = {}
        self.node_ips: dict[str, str] = {}
        self.setup_seconds = Histogram()
        self.state = Path(cfg.state_dir)
        self._dp: Dataplane | None = None
        self._fw: Firewall | None = None
        self._alloc: Allocator | None = None
        self.sync_needed = threading.Event()
        self.pending_sync: set[str | int] = set()
        self.user_vnis: dict[str, int] = {}  # a user's VNI never changes
        self.registered_vteps: set[int] = set()
        self.idle_user_nets: dict[int, tuple[float, int]] = {}  # vni -> (last pod gone, uid)
        # etcd round trips that overlap with netlink work (job_up)
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="etcd")

    # -- components (set by start()) ---------------------------------------------------
    @property
    def cluster(self) -> ClusterConfig:
        return _started(self._cluster)

    @property
    def dp(self) -> Dataplane:
        return _started(self._dp)

    @property
    def fw(self) -> Firewall:
        return _started(self._fw)

    @property
    def alloc(self) -> Allocator:
        return _started(self._alloc)

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
        return ClusterConfig.from_dict(data, f"etcd {self.keys.config}")

    def start(self) -> None:
        cc = self._cluster = self.load_cluster_config()
        self.state.mkdir(parents=True, exist_ok=True)
        Path(self.cfg.resolv_dir).mkdir(parents=True, exist_ok=True)
        self._alloc = Allocator(
            self.etcd,
            self.keys,
            Ipam(cc.pod_cidr, cc.block_prefix),
            cc.zone,
            cc.vni_min,
            cc.vni_max,
        )
        self._dp = Dataplane(
            self.cfg.netns_dir,
            self.cfg.resolv_dir,
            self.cfg.underlay_interface,
            self.cfg.underlay_ip,
            cc.vxlan_port,
            cc.underlay_mtu,
        )
        with contextlib.suppress(OSError):
            Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        self.register_node()
        rev = self.alloc.load_view()
        self._fw = Firewall(cc.pod_cidr, cc.vxlan_port, cc.host_cidrs, self.cfg.host_uids)
        self.refresh_nodes()
        self.reconcile()
        self.sync_routes()
        for prefix in ("blocks", "ips", "vteps", "nodes"):
            self.etcd.watch_prefix(
                self.keys.prefix(prefix), rev, self._on_event, self._resync, self.stop
            )
        loops = (
            self._keepalive_loop,
            self._sync_loop,
            self._session_loop,
            self._gc_loop,
            self._linger_loop,
        )
        for target in loops:
            threading.Thread(target=target, name=target.__name__, daemon=True).start()

    def register_node(self) -> None:
        # the node's lease (liveness and login records) survives a restart of podnetd
        # shorter than its TTL: reuse it, so nothing of a running login pod expires
        lease_file = self.state / "lease"
        old = 0
        with contextlib.suppress(OSError, ValueError):
            old = int(lease_file.read_text())
        if old and self.etcd.lease_ttl(old) > 0:
            self.lease = old
        else:
            self.lease = self.etcd.lease_grant(max(10, self.cluster.login_lease_ttl))
            lease_file.write_text(str(self.lease))
        self.etcd.put_many(
            [
                op_put(
                    self.keys.node(self.cfg.node),
                    {"ip": self.cfg.underlay_ip, "roles": self.cfg.roles},
                ),
                op_put(
                    self.keys.alive(self.cfg.node),
                    {"ip": self.cfg.underlay_ip, "version": __version__},
                    self.lease,
                ),
            ]
        )

    # -- etcd events ---------------------------------------------------------------------
    def _on_event(self, kind: str, key: str, kv: Any) -> None:
        """Watch events: keep the IPAM view current, queue only the sync that is needed."""
        rel = key[len(self.keys.root) :]
        if rel.startswith("ips/"):
            self.alloc.ipam.mark([rel[4:]], used=(kind == "put"))
            return
        if rel.startswith("blocks/"):
            blk = ipaddress.IPv4Network(block_from_key(key))
            node = kv.json().get("node") if kv is not None else None
            self.alloc.ipam.set_block(blk, node)
            self._queue("routes")
        elif rel.startswith("nodes/"):
            self._queue("nodes")
        elif rel.startswith("vteps/"):
            parts = rel.split("/")
            if len(parts) == 3 and parts[1].isdigit() and parts[2] != self.cfg.node:
                self._queue(int(parts[1]))

    def _queue(self, what: str | int) -> None:
        with self.lock:
            self.pending_sync.add(what)
        self.sync_needed.set()

    def _resync(self) -> int:
        rev = self.alloc.load_view()
        self._queue("nodes")
        self._queue("routes")
        self._queue("fdb")
        return rev

    def _sync_loop(self) -> None:
        while not self.stop.is_set():
            if not self.sync_needed.wait(5):
                continue
            time.sleep(0.05)  # debounce: one pass for a burst of events
            self.sync_needed.clear()
            with self.lock:
                todo, self.pending_sync = self.pending_sync, set()
            try:
                if "nodes" in todo:
                    self.refresh_nodes()
                if "routes" in todo or "nodes" in todo:
                    self.sync_routes()
                if "fdb" in todo:
                    self.sync_fdb()
                else:
                    for vni in (t for t in todo if isinstance(t, int)):
                        self.dp.set_vteps(vni, self.vteps_of(vni))
            except Exception:  # keep syncing; the next event retries
                log.exception("sync failed")
                self._queue("fdb")
                time.sleep(1)

    def refresh_nodes(self) -> None:
        kvs, _ = self.etcd.get_prefix(self.keys.prefix("nodes"))
        ips = {kv.key.rsplit("/", 1)[-1]: str(kv.json().get("ip")) for kv in kvs}
        if ips != self.node_ips:
            self.node_ips = ips
            self.fw.resync(sorted(set(ips.values())), self.fw_ports())

    def fw_ports(self) -> list[tuple[str, str, str]]:
        with self.lock:
            return [(p.veth, nl.mac_for_ip(p.ip), p.ip) for p in self.pods.values() if p.veth]

    def sync_routes(self) -> None:
        ipam = self.alloc.ipam
        with ipam.lock:
            blocks = dict(ipam.blocks)
        routes = {str(b): self.node_ips[n] for b, n in blocks.items() if n in self.node_ips}
        local = {str(b) for b, n in blocks.items() if n == self.cfg.node}
        self.dp.set_block_routes(routes, local)

    def vteps_of(self, vni: int) -> list[str]:
        kvs, _ = self.etcd.get_prefix(self.keys.prefix(f"vteps/{vni}"))
        return sorted({str(kv.json()["ip"]) for kv in kvs})

    def sync_fdb(self) -> None:
        for vni in list(self.dp.user_ports()):
            self.dp.set_vteps(vni, self.vteps_of(vni))

    # -- users ---------------------------------------------------------------------------
    def _user_lock(self, uid: int) -> threading.Lock:
        with self.lock:
            return self.user_locks.setdefault(uid, threading.Lock())

    def _vni(self, user: str, uid: int) -> int:
        vni = self.user_vnis.get(user)
        if vni is None:
            vni = self.user_vnis[user] = self.alloc.user_vni(user, uid)
        return vni

    def _ensure_user_net(self, user: str, uid: int) -> tuple[int, int]:
        """(vni, bridge index): the user's VNI, bridge, VXLAN and VTEP registration."""
        vni = self._vni(user, uid)
        with self.lock:
            self.idle_user_nets.pop(vni, None)
        if vni not in self.registered_vteps:
            self.etcd.put(self.keys.vtep(vni, self.cfg.node), {"ip": self.cfg.underlay_ip})
            self.registered_vteps.add(vni)
        bri = self.dp.user_bridge(vni)
        if bri is None:  # first pod of this user here: bridge, VXLAN, FDB in one go
            bri = self.dp.ensure_user(vni, self.vteps_of(vni))
        return vni, bri

    def _maybe_remove_user(self, vni: int, uid: int) -> None:
        """The user's last pod here is gone: their bridge, VXLAN and VTEP stay for
        `user_net_linger` seconds (a user running short jobs one after the other pays
        for them once, not per job), then `_linger_loop` removes them. Called with the
        user's lock held."""
        with self.lock:
            if any(p.vni == vni for p in self.pods.values()):
                return
            if self.cfg.user_net_linger > 0:
                self.idle_user_nets.setdefault(vni, (time.monotonic(), uid))
                return
        self._remove_user_net(vni)

    def _remove_user_net(self, vni: int) -> None:
        with contextlib.suppress(EtcdUnavailable, EtcdRequestError):
            self.etcd.delete(self.keys.vtep(vni, self.cfg.node))
        self.registered_vteps.discard(vni)
        self.dp.remove_user(vni)

    def remove_idle_user_nets(self, now: float) -> list[int]:
        """Remove the user networks idle for `user_net_linger` seconds, each under its
        user's lock (a pod being built keeps its bridge); returns their VNIs."""
        linger = self.cfg.user_net_linger
        with self.lock:
            due = [(v, uid) for v, (t, uid) in self.idle_user_nets.items() if now - t >= linger]
        done = []
        for vni, uid in due:
            with self._user_lock(uid):
                with self.lock:
                    if self.idle_user_nets.pop(vni, None) is None or any(
                        p.vni == vni for p in self.pods.values()
                    ):
                        continue
                self._remove_user_net(vni)
                done.append(vni)
        return done

    def _linger_loop(self) -> None:
        while not self.stop.wait(min(5.0, max(0.5, self.cfg.user_net_linger / 4))):
            try:
                for vni in self.remove_idle_user_nets(time.monotonic()):
                    log.info(
                        "VNI %d: no pod here for %.0f s, network removed",
                        vni,
                        self.cfg.user_net_linger,
                    )
            except Exception:
                log.exception("removing idle user networks failed")

    # -- pods ----------------------------------------------------------------------------
    def _build(self, pod: Pod, search: list[str], ns: NewNetns | None = None) -> None:
        cc = self.cluster
        if ns is None:
            bri = self.dp.user_bridge(pod.vni)
            if bri is None:
                bri = self.dp.ensure_user(pod.vni, self.vteps_of(pod.vni))
            ns = self.dp.new_netns(pod.name, bri, cc.pod_mtu)
        spec = PodSpec(pod.name, pod.ip, pod.prefix, pod.vni, cc.pod_mtu, cc.gateway_ip)
        pod.veth = self.dp.wire_pod(ns, spec, search + cc.search_domains, cc.dns_servers)
        try:
            self.fw.add_port(pod.veth, nl.mac_for_ip(pod.ip), pod.ip)
        except Exception:
            self.dp.remove_pod(pod.name, pod.ip)
            raise

    def _unbuild(self, pod: Pod) -> bool:
        """Undo `_build`: netns, route, resolv.conf, nftables element. True if the
        netns existed."""
        existed = self.dp.remove_pod(pod.name, pod.ip)
        if pod.veth:
            self.fw.del_port(pod.veth, nl.mac_for_ip(pod.ip), pod.ip)
        return existed

    def _names(self, job: Job, index: int) -> list[str]:
        z = self.cluster.zone
        return [f"pod{index}.{job.label}.{job.user}.{z}", f"pod{index}.{job.job_id}.{job.user}.{z}"]

    def job_up(
        self, job_id: int, user: str, uid: int, job_name: str, nodes: list[str], node_index: int
    ) -> Pod:
        if nodes[node_index] != self.cfg.node:
            raise PodnetError(
                "EINVAL",
                f"nodes[{node_index}] is {nodes[node_index]!r}, this node is {self.cfg.node!r}",
            )
        name = job_netns(job_id)
        t0 = time.monotonic()
        with self._user_lock(uid):
            with self.lock:
                pod = self.pods.get(name)
            if pod is not None:
                if pod.user != user:
                    raise PodnetError("EPERM", f"job {job_id} belongs to another user")
                return pod
            vni, bri = self._ensure_user_net(user, uid)
            # the allocation travels to etcd while this thread creates the empty netns
            allocating = self.pool.submit(
                self.alloc.allocate_job, job_id, user, uid, job_name, nodes, vni, node_index
            )
            try:
                ns = self.dp.new_netns(name, bri, self.cluster.pod_mtu)
            except BaseException:
                wait([allocating])
                raise
            try:
                job = allocating.result()
                if job.user != user:
                    raise PodnetError("EPERM", f"job {job_id} belongs to another user")
            except BaseException as e:
                self.dp.discard(ns)
                if isinstance(e, AllocError):
                    raise PodnetError("EINVAL", str(e)) from None
                raise
            pod = Pod(
                "job",
                name,
                str(self.dp_path(name)),
                job.ips[node_index],
                self.cluster.pod_cidr.prefixlen,
                user,
                uid,
                vni,
                job_id,
                node_index,
                self._names(job, node_index),
            )
            z = self.cluster.zone
            # the pod's records and marker travel to etcd while this thread wires the pod
            publishing = self.pool.submit(self.alloc.publish_pod, job, node_index, self.cfg.node)
            search = [f"{job.label}.{user}.{z}", f"{job_id}.{user}.{z}", f"{user}.{z}"]
            try:
                self._build(pod, search, ns)
            except BaseException:
                wait([publishing])
                if publishing.exception() is None:
                    with contextlib.suppress(EtcdUnavailable, EtcdRequestError):
                        self.alloc.unpublish_pod(job, node_index, self.cfg.node)
                raise
            try:
                publishing.result()
            except BaseException:
                self._unbuild(pod)
                raise
            with self.lock:
                self.pods[name] = pod
        self.setup_seconds.observe(time.monotonic() - t0)
        log.info("job %d: pod %s %s for %s", job_id, name, pod.ip, user)
        return pod

    def dp_path(self, name: str) -> Path:
        return self.dp.netns_path(name)

    def job_down(self, job_id: int) -> bool:
        name = job_netns(job_id)
        with self.lock:
            pod = self.pods.pop(name, None)
        existed = self._unbuild(pod) if pod else self.dp.remove_pod(name, None)
        self.alloc.leave_job(job_id, self.cfg.node)
        if pod:
            with self._user_lock(pod.uid):
                self._maybe_remove_user(pod.vni, pod.uid)
        return existed or pod is not None

    def job_get(self, job_id: int) -> Pod:
        with self.lock:
            pod = self.pods.get(job_netns(job_id))
        if pod is None:
            raise PodnetError("ENOENT", f"job {job_id} has no pod on this node")
        return pod

    # -- logins --------------------------------------------------------------------------
    def login_acquire(self, uid: int, pid: int) -> Pod:
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            raise PodnetError("EINVAL", f"uid {uid} has no user name") from None
        name = login_netns(uid)
        with self._user_lock(uid), self.lock:
            pod = self.pods.get(name)
            if pod is None:
                vni, _ = self._ensure_user_net(user, uid)
                try:
                    ip = self.alloc.allocate_login(self.cfg.node, user, uid, self.lease)
                except AllocError as e:
                    raise PodnetError("EUNAVAIL", str(e)) from None
                z = self.cluster.zone
                label = login_label(self.cfg.node)
                pod = Pod(
                    "login",
                    name,
                    str(self.dp_path(name)),
                    ip,
                    self.cluster.pod_cidr.prefixlen,
                    user,
                    uid,
                    vni,
                    names=[f"{label}.login.{user}.{z}"],
                )
                self._build(pod, [f"{user}.{z}"])
                self.pods[name] = pod
            if pid > 0:
                self.sessions.setdefault(uid, {})[pid] = _starttime(pid)
                self.idle_since.pop(uid, None)
                self._save_sessions()
        return pod

    def login_release(self, uid: int) -> bool:
        name = login_netns(uid)
        with self._user_lock(uid):
            with self.lock:
                pod = self.pods.pop(name, None)
                self.sessions.pop(uid, None)
                self.idle_since.pop(uid, None)
                self._save_sessions()
            existed = self._unbuild(pod) if pod else self.dp.remove_pod(name, None)
            if pod:
                self.alloc.release_login(self.cfg.node, pod.user)
                self._maybe_remove_user(pod.vni, pod.uid)
        return existed or pod is not None

    def join(self, uid: int, target: str, job_id: int | None) -> Pod:
        with self.lock:
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
            mine = [p for p in self.pods.values() if p.kind == "job" and p.uid == uid]
            if not mine:
                raise PodnetError("ENOENT", "you have no job on this node")
            return max(mine, key=lambda p: (p.created, p.job_id or 0))

    def list_pods(self, uid: int | None) -> list[Pod]:
        with self.lock:
            return [p for p in self.pods.values() if uid is None or p.uid == uid]

    def status(self) -> dict[str, Any]:
        try:
            st = self.etcd.status()
            etcd = {"ok": True, "version": st.get("version"), "leader": st.get("leader")}
        except (EtcdUnavailable, EtcdRequestError) as e:
            etcd = {"ok": False, "error": str(e)}
        with self.lock:
            pods = list(self.pods.values())
        return {
            "node": self.cfg.node,
            "etcd": etcd,
            "pods": len(pods),
            "users": len({p.uid for p in pods}),
            "version": __version__,
            "cluster": self.cfg.cluster,
        }

    # -- sessions of login pods ----------------------------------------------------------
    def _save_sessions(self) -> None:
        data = {str(u): {str(p): s for p, s in pids.items()} for u, pids in self.sessions.items()}
        tmp = self.state / "sessions.json.tmp"
        tmp.write_text(json.dumps(data))
        tmp.replace(self.state / "sessions.json")

    def _load_sessions(self) -> None:
        try:
            data = json.loads((self.state / "sessions.json").read_text())
        except (OSError, ValueError):
            return
        for u, pids in data.items():
            self.sessions[int(u)] = {int(p): int(s) for p, s in pids.items()}

    def _session_loop(self) -> None:
        while not self.stop.wait(1.0):
            now = time.monotonic()
            release = []
            with self.lock:
                for uid in {p.uid for p in self.pods.values() if p.kind == "login"}:
                    pids = self.sessions.get(uid, {})
                    live = {p: s for p, s in pids.items() if _starttime(p) == s and s}
                    if live != pids:
                        self.sessions[uid] = live
                        self._save_sessions()
                    if live:
                        self.idle_since.pop(uid, None)
                        continue
                    since = self.idle_since.setdefault(uid, now)
                    if now - since >= self.cluster.login_grace:
                        release.append(uid)
            for uid in release:
                log.info("uid %d: no session left, releasing the login pod", uid)
                try:
                    self.login_release(uid)
                except Exception:
                    log.exception("releasing the login pod of uid %d failed", uid)

    # -- leases, GC, reconcile -------------------------------------------------------------
    def _keepalive_loop(self) -> None:
        period = max(1.0, self.cluster.login_lease_ttl / 3)
        while not self.stop.wait(period):
            try:
                if self.etcd.lease_keepalive(self.lease) <= 0:
                    log.warning("node lease expired: registering again")
                    self.register_node()
                    self.reregister_pods()
            except (EtcdUnavailable, EtcdRequestError) as e:
                log.warning("lease keepalive: %s", e)

    def reregister_pods(self) -> None:
        """After a lease loss: VTEPs and login records again on the new lease."""
        with self.lock:
            pods = list(self.pods.values())
        for vni in {p.vni for p in pods}:
            self.etcd.put(self.keys.vtep(vni, self.cfg.node), {"ip": self.cfg.underlay_ip})
            self.registered_vteps.add(vni)
        for p in pods:
            if p.kind == "login":
                self._adopt_login(p)

    def _adopt_login(self, p: Pod) -> None:
        self.etcd.put_many(
            self.alloc.login_record_ops(self.cfg.node, p.user, p.uid, p.ip, self.lease)
        )

    def live_jobs(self) -> set[int] | None:
        """Job ids Slurm knows (None when the job source cannot answer)."""
        try:
            out = subprocess.run(
                self.cfg.job_source, capture_output=True, text=True, timeout=30, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("job source %s: %s", self.cfg.job_source[0], e)
            return None
        ids = set()
        for tok in out.split():
            base = tok.split("_")[0].split("+")[0]
            if base.isdigit():
                ids.add(int(base))
        return ids

    def gc_once(self) -> list[int]:
        """Remove job pods whose job Slurm no longer knows; returns their ids."""
        with self.lock:
            jobs = [(p.job_id, p.created) for p in self.pods.values() if p.kind == "job"]
        live = self.live_jobs()
        if live is None:
            return []
        gone = [
            j
            for j, created in jobs
            if j is not None and j not in live and time.time() - created > 5
        ]
        for j in gone:
            log.info("GC: job %d is gone, removing its pod", j)
            self.job_down(j)
        self.gc_records(live)
        return gone

    def gc_records(self, live: set[int]) -> list[int]:
        """Release etcd records of jobs Slurm no longer knows (nodes that died)."""
        kvs, _ = self.etcd.get_prefix(self.keys.prefix("jobs"))
        out = []
        for kv in kvs:
            job = Job.from_json(kv.json(), kv.mod_revision)
            if job.job_id not in live and time.time() - job.created > 60:
                self.alloc.release_job(job)
                out.append(job.job_id)
        return out

    def _gc_loop(self) -> None:
        while not self.stop.wait(self.cfg.gc_interval):
            try:
                self.gc_once()
            except Exception:
                log.exception("GC failed")

    def reconcile(self) -> None:
        """Kernel state versus etcd at start: adopt live pods, remove what has no owner."""
        self._load_sessions()
        for name in self.dp.remove_stale_files():
            log.info("reconcile: removed the stale pod file %s", name)
        for name in self.dp.pod_netns_names():
            try:
                pod = self._adopt(name)
            except Exception:
                log.exception("reconcile: cannot adopt %s", name)
                pod = None
            if pod is None:
                log.info("reconcile: removing orphan pod %s", name)
                self.dp.remove_pod(name, None)
                continue
            with self.lock:
                self.pods[name] = pod
        # routes to pods that are gone, users with a bridge and no pod
        with self.lock:
            ips = {p.ip for p in self.pods.values()}
        self.dp.remove_pod_routes_except(ips)
        ports = self.dp.user_ports()
        with self.lock:
            vnis = {p.vni for p in self.pods.values()}
        for vni in ports:
            if vni not in vnis:
                self.dp.remove_user(vni)
        # the host network stays as it was (links of an older podnetd had addresses);
        # removing a link's last IPv4 address drops its routes: the pods' /32 come back
        removed = self.dp.scrub_host_links()
        if removed:
            log.info("reconcile: removed %d addresses from podnet links", removed)
        with self.lock:
            self.dp.set_pod_routes({p.ip: p.vni for p in self.pods.values()})
        for vni in vnis:
            self.etcd.put(self.keys.vtep(vni, self.cfg.node), {"ip": self.cfg.underlay_ip})
            self.registered_vteps.add(vni)
        self.fw.resync(sorted(set(self.node_ips.values())), self.fw_ports())

    def _adopt(self, name: str) -> Pod | None:
        veth = self.dp.pod_veth(name) or ""
        if name.startswith("pn-j") and name[4:].isdigit():
            return self._adopt_job(name, veth)
        if name.startswith("pn-l") and name[4:].isdigit():
            return self._adopt_login_pod(name, veth)
        return None

    def _adopt_job(self, name: str, veth: str) -> Pod | None:
        job = self.alloc.get_job(int(name[4:]))
        if job is None or self.cfg.node not in job.nodes:
            return None
        i = job.nodes.index(self.cfg.node)
        if not veth or self._pod_ip(name) != job.ips[i]:
            return None  # half-built (the agent died while creating it): rebuild on demand
        self.alloc.publish_pod(job, i, self.cfg.node)
        return Pod(
            "job",
            name,
            str(self.dp_path(name)),
            job.ips[i],
            self.cluster.pod_cidr.prefixlen,
            job.user,
            job.uid,
            job.vni,
            job.job_id,
            i,
            self._names(job, i),
            veth=veth,
        )

    def _adopt_login_pod(self, name: str, veth: str) -> Pod | None:
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
        label = login_label(self.cfg.node)
        pod = Pod(
            "login",
            name,
            str(self.dp_path(name)),
            ip,
            self.cluster.pod_cidr.prefixlen,
            user,
            uid,
            vni,
            names=[f"{label}.login.{user}.{self.cluster.zone}"],
            veth=veth,
        )
        self._adopt_login(pod)
        return pod

    def _pod_ip(self, name: str) -> str | None:
        try:
            sock = self.dp.host.run_in(self.dp.netns_path(name), nl.Netlink)
        except OSError:
            return None
        try:
            return nl.first_ipv4(sock, "eth0")
        finally:
            sock.close()

    def shutdown(self) -> None:
        self.stop.set()
        self.pool.shutdown(wait=False)
        if self._dp is not None:
            self._dp.close()


def _started(component: T | None) -> T:
    """A component start() sets up; using it before start() is a programming error."""
    if component is None:
        raise RuntimeError("agent not started")
    return component


def _starttime(pid: int) -> int:
    """Start time of a process (clock ticks since boot), 0 if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:  # noqa: PTH123
            data = f.read()
    except OSError:
        return 0
    try:
        return int(data.rsplit(b")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return 0
