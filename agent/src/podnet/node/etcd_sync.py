# SPDX-License-Identifier: Apache-2.0
"""The etcd sync loop: one place where the cluster's state in etcd becomes this node's
routes, VXLAN forwarding entries and firewall sets (as flannel's vxlan network loop).

Watchers on `jobs/`, `logins/`, `containers/`, `users/`, `blocks/` and `nodes/` (all on the
client's one watch stream) feed `on_event`. A pod record (a job's, a login pod's, a
container's) says where each address of a user's network is: which nodes are the VNI's
VTEPs (flood entries) and which node each remote pod MAC is behind (a unicast entry, so a
frame to a pod goes to its node alone); the job records also fill `JobRecords`, from
which the allocator takes a job instead of reading it. The addresses' own records
(`ips/`) are not watched: a job's allocation writes one per node in one transaction, and
every watcher of `ips/` would get them all (the job record carries the same, once).
A VTEP's address is always its node's registered one (`nodes/`, written by the
collection), never one a record names.

`on_event` keeps the allocator's IPAM view and the job records current at once and queues
only the sync an event needs: a block moved (routes), a node came or went (node table,
firewall, routes), the pods of a user on other nodes changed (that user's FDB). `run`
applies the queue in one pass per burst of events; a failed pass is retried in full.
After a watch was compacted away, `resync` re-reads everything in one transaction (one
revision for all of it).

It also undoes what another writer changed in records etcd lets every node write
(docs/security.md "etcd authentication"): a user's VNI (`users/`, `vnis/`: created once,
never changed nor deleted by podnet) is put back as this node first saw it, and the record
of a job with a pod on this node as this node keeps it (`own_job`, the reconciler's); a
deleted one is written back by the reconciler (`on_job_lost`). The write back is guarded by
the revision the change had, so of all the nodes that saw it one writes.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from podnet.kernel.dataplane import Dataplane
from podnet.kernel.firewall import Firewall
from podnet.names import Keys, block_from_key
from podnet.node.pods import PodTable
from podnet.node.view import ClusterView, SyncQueue
from podnet.state.alloc import Allocator, Job
from podnet.state.etcdops import KV, cmp_mod, json_dumps, op_get, op_put
from podnet.state.store import Etcd, EtcdRequestError, EtcdUnavailable

log = logging.getLogger("podnet.sync")

#: a burst of events is applied in one pass after this quiet time
DEBOUNCE = 0.05
WATCHED = ("jobs", "logins", "containers", "users", "vnis", "blocks", "nodes")


class EtcdSync:
    def __init__(
        self,
        etcd: Etcd,
        keys: Keys,
        node: str,
        alloc: Allocator,
        dp: Dataplane,
        fw: Firewall,
        pods: PodTable,
        view: ClusterView,
        work: SyncQueue,
        own_job: Callable[[int], Job | None] = lambda job_id: None,
        on_job_lost: Callable[[int], None] = lambda job_id: None,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        """`own_job`: this node's copy of a job's record, if it has a pod of it
        (reconcile.local); `on_job_lost`: a job with a pod here lost its record (the
        reconciler writes it back); `on_idle`: called on quiet passes (every 5 s without
        events): the egress route check."""
        self.etcd = etcd
        self.keys = keys
        self.node = node
        self.alloc = alloc
        self.dp = dp
        self.fw = fw
        self.pods = pods
        self.view = view
        self.work = work
        self.own_job = own_job
        self.on_job_lost = on_job_lost
        self.on_idle = on_idle
        #: the addresses each login or container record holds (key -> ips)
        self._held: dict[str, list[str]] = {}
        #: the lock of the two tables below and of `_held`
        self._mutex = threading.Lock()
        #: users' and VNIs' records as this node first saw them (key -> value)
        self._first_seen: dict[str, str] = {}
        #: records to write back (key -> (value, the revision of the change))
        self._restores: dict[str, tuple[str, int]] = {}

    # -- events ----------------------------------------------------------------------
    def on_event(self, kind: str, key: str, kv: KV | None) -> None:
        rel = key[len(self.keys.root) :]
        what, _sep, rest = rel.partition("/")
        if what == "jobs":
            if rest.isdigit():
                self._job(int(rest), kv if kind == "put" else None)
        elif what in ("logins", "containers"):
            self._pod_record(key, what, rest, kv if kind == "put" else None)
        elif what == "users":
            self._user(rest, kv if kind == "put" else None)
        elif what == "vnis":
            self._changed_once_created(key, kv if kind == "put" else None)
        elif what == "blocks":
            blk = ipaddress.IPv4Network(block_from_key(key))
            node = _json(kv).get("node") if kv is not None else None
            self.alloc.ipam.set_block(blk, node if isinstance(node, str) else None)
            self.queue("routes")
        elif what == "nodes":
            self.queue("nodes")

    def _job(self, job_id: int, kv: KV | None) -> None:
        jobs = self.alloc.jobs
        mine = self.own_job(job_id)
        if kv is None:
            old = jobs.remove(job_id) if jobs is not None else None
            if old is not None:
                self._hold(f"jobs/{job_id}", [], old.vni, [])
            if mine is not None:
                log.warning("job %d: its record was deleted while its pod runs here", job_id)
                self.on_job_lost(job_id)
            return
        try:
            job = Job.from_json(kv.json(), kv.mod_revision)
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring the unreadable job record %s", kv.key)
            job = None
        if mine is not None and (job is None or job.to_json() != mine.to_json()):
            self._tampered(kv.key, kv.mod_revision, store_json(mine.to_json()))
            job = mine  # what this node keeps using meanwhile
        if job is None:
            return
        if jobs is not None:
            jobs.put(job)
        self._hold(f"jobs/{job_id}", job.ips, job.vni, job.nodes)

    def _pod_record(self, key: str, what: str, rest: str, kv: KV | None) -> None:
        node, _sep, name = rest.partition("/")
        if not node or not name:
            return
        if kv is None:
            self._hold(key, [], 0, [])
            return
        d = _json(kv)
        ip = d.get("ip")
        vni = d.get("vni")
        if not isinstance(vni, int):  # login records name the user, not the VNI
            vni = self.view.user_vni(name if what == "logins" else str(d.get("user")))
        if isinstance(ip, str) and isinstance(vni, int):
            self._hold(key, [ip], vni, [node])

    def _hold(self, key: str, ips: list[str], vni: int, nodes: list[str]) -> None:
        """The record `key` now holds `ips` (each on the node at the same place in `nodes`)
        in VNI `vni` (none: it was deleted): the IPAM view, the pods' locations and the
        FDB of the VNIs whose remote pods changed."""
        with self._mutex:
            before = self._held.pop(key, [])
            if ips:
                self._held[key] = list(ips)
        gone = [ip for ip in before if ip not in ips]
        if gone:
            self.alloc.ipam.mark(gone, used=False)
        if ips:
            self.alloc.ipam.mark(ips)
        changed: set[int] = set()
        for ip in gone:
            changed |= self.view.locate(ip, None)
        for ip, node in zip(ips, nodes, strict=False):
            changed |= self.view.locate(ip, (vni, node))
        for v in changed:
            self.queue(v)

    def _user(self, user: str, kv: KV | None) -> None:
        key = self.keys.user(user)
        if self._changed_once_created(key, kv):
            return
        vni = _json(kv).get("vni") if kv is not None else None
        with self.view.mutex:
            if isinstance(vni, int):
                self.view.user_vnis[user] = vni
            else:
                self.view.user_vnis.pop(user, None)

    def _changed_once_created(self, key: str, kv: KV | None) -> bool:
        """A user's or a VNI's record is created once and never changed nor deleted by
        podnet: a change of one this node has seen is another writer's, to undo."""
        with self._mutex:
            first = self._first_seen.get(key)
            if first is None and kv is not None:
                self._first_seen[key] = kv.value
                return False
        if first is None or (kv is not None and kv.value == first):
            return False
        log.warning(
            "%s was %s by another writer (it held %s): writing it back",
            key,
            "deleted" if kv is None else f"changed to {kv.value}",
            first,
        )
        self._tampered(key, kv.mod_revision if kv is not None else 0, first)
        return True

    def _tampered(self, key: str, revision: int, value: str) -> None:
        with self._mutex:
            self._restores[key] = (value, revision)
        self.queue("restore")

    def restore(self) -> int:
        """Write back the records another writer changed (guarded by the revision of the
        change, so of all the nodes that saw it one writes); returns how many."""
        with self._mutex:
            todo, self._restores = self._restores, {}
        done = 0
        for key, (value, rev) in todo.items():
            try:
                r = self.etcd.txn([cmp_mod(key, rev)], [op_put(key, value)])
            except (EtcdUnavailable, EtcdRequestError) as e:
                log.warning("%s: cannot write it back: %s (again later)", key, e)
                with self._mutex:
                    self._restores.setdefault(key, (value, rev))
                continue
            done += int(r.succeeded)
        return done

    def queue(self, what: str | int) -> None:
        """'nodes', 'routes', 'fdb' (every user) or a VNI (that user's FDB)."""
        self.work.put(what)

    def user_fdb(self, vni: int) -> None:
        """The user's FDB as etcd says (after their network was made here)."""
        self.dp.set_vteps(vni, self.view.vteps_of(vni), self.view.remote_macs(vni))

    def resync(self) -> int:
        """Everything the watchers follow, read again in one transaction (one revision):
        the IPAM view, the job records, the pods' locations, the users' VNIs, the node
        table. Returns the revision to watch from."""
        r = self.etcd.txn([], [op_get(self.keys.prefix(p), prefix=True) for p in (*WATCHED, "ips")])
        by = {p: r.range_kvs(i) for i, p in enumerate((*WATCHED, "ips"))}
        present = {kv.key: kv for what in ("users", "vnis") for kv in by[what]}
        with self._mutex:
            known = list(self._first_seen)
        for key in sorted(set(known) | set(present)):
            self._changed_once_created(key, present.get(key))
        view = self.view
        with self._mutex, view.mutex:
            view.pods_at.clear()
            view.ip_vni.clear()
            self._held.clear()
            view.user_vnis.clear()
            view.user_vnis.update(
                (kv.key.rsplit("/", 1)[-1], v)
                for kv in by["users"]
                if isinstance(v := _json(kv).get("vni"), int)
            )
        ipam = self.alloc.ipam
        with ipam.lock:
            ipam.used.clear()
            ipam.blocks.clear()
            ipam.node_blocks.clear()
            ipam.claims.clear()
        for kv in by["blocks"]:
            node = _json(kv).get("node")
            ipam.set_block(
                ipaddress.IPv4Network(block_from_key(kv.key)),
                node if isinstance(node, str) else None,
            )
        # every address in use (also those no pod record names: older podnetd's records)
        ipam.mark(kv.key.rsplit("/", 1)[-1] for kv in by["ips"])
        jobs = []
        for kv in by["jobs"]:
            try:
                jobs.append(Job.from_json(kv.json(), kv.mod_revision))
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring the unreadable job record %s", kv.key)
        if self.alloc.jobs is not None:
            self.alloc.jobs.reset(jobs)
        for job in jobs:
            self._hold(f"jobs/{job.job_id}", job.ips, job.vni, job.nodes)
            mine = self.own_job(job.job_id)
            if mine is not None and job.to_json() != mine.to_json():
                self._tampered(self.keys.job(job.job_id), job.revision, store_json(mine.to_json()))
        for what in ("logins", "containers"):
            for kv in by[what]:
                rel = kv.key[len(self.keys.prefix(what)) :]
                self._pod_record(kv.key, what, rel, kv)
        if self._set_nodes(by["nodes"]) and self.fw is not None:  # no firewall: a view only
            self.resync_firewall()
        for what in ("nodes", "routes", "fdb"):
            self.queue(what)
        return r.revision

    def watch(self, rev: int, stop: threading.Event) -> None:
        for prefix in WATCHED:
            self.etcd.watch_prefix(self.keys.prefix(prefix), rev, self.on_event, self.resync, stop)

    # -- the loop ----------------------------------------------------------------------
    def take(self) -> set[str | int]:
        return self.work.take()

    def apply(self, todo: set[str | int]) -> None:
        if "restore" in todo:
            self.restore()
        moved = "nodes" in todo and self.refresh_nodes()
        if "routes" in todo or "nodes" in todo:
            self.sync_routes()
        if "fdb" in todo or moved:
            self.sync_fdb()
        else:
            for vni in (t for t in todo if isinstance(t, int)):
                self.user_fdb(vni)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self.work.wait(5):
                # quiet: the kernel drops routes through a link that went down (a flap,
                # a gateway's failover test): put back what etcd says, if anything is gone
                try:
                    self.sync_routes()
                    if self.fw.stepd_moved():  # slurmstepd's cgroup made again: new id
                        self.resync_firewall()
                    if self.on_idle is not None:
                        self.on_idle()
                except Exception:
                    log.exception("route check failed")
                continue
            time.sleep(DEBOUNCE)
            self.work.clear_wake()
            try:
                self.apply(self.take())
            except Exception:  # keep syncing; the next pass redoes everything
                log.exception("sync failed")
                self.queue("nodes")
                self.queue("fdb")
                time.sleep(1)

    # -- what a pass does ----------------------------------------------------------------
    def _set_nodes(self, kvs: list[KV]) -> bool:
        ips = {kv.key.rsplit("/", 1)[-1]: str(_json(kv).get("ip")) for kv in kvs}
        with self.view.mutex:
            if ips == self.view.node_ips:
                return False
            self.view.node_ips = ips
        return True

    def refresh_nodes(self) -> bool:
        """The node table from etcd; True if it changed (firewall resynced)."""
        if not self._set_nodes(self.etcd.get_prefix(self.keys.prefix("nodes"))[0]):
            return False
        self.resync_firewall()
        return True

    def resync_firewall(self) -> None:
        self.fw.resync(self.view.node_addresses(), self.pods.fw_ports())

    def sync_routes(self) -> None:
        ipam = self.alloc.ipam
        with ipam.lock:
            blocks = dict(ipam.blocks)
        node_ips = self.view.node_ips
        routes = {str(b): node_ips[n] for b, n in blocks.items() if n in node_ips}
        local = {str(b) for b, n in blocks.items() if n == self.node}
        self.dp.set_block_routes(routes, local)

    def sync_fdb(self) -> None:
        for vni in list(self.dp.user_ports()):
            self.user_fdb(vni)


def store_json(d: dict[str, Any]) -> str:
    """A record's text as the allocator writes it (op_put's encoding)."""
    return json_dumps(d)


def _json(kv: KV | None) -> dict[str, Any]:
    """A record's JSON object ({} when it is something else)."""
    try:
        d = kv.json() if kv is not None else None
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}
