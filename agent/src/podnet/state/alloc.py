# SPDX-License-Identifier: Apache-2.0
"""Allocation in etcd: user VNIs, node address blocks, job, login and container IPs, DNS
records.

Every allocation is one etcd transaction guarded by `create_revision == 0` on the keys it
creates (`ips/<ip>`, `blocks/<cidr>`, `users/<u>`, `vnis/<v>`, `jobs/<id>`), so two
agents can never hand out the same IP, block or VNI: the loser's transaction fails and it
retries with a fresher view (or, for a job, reads what the winner wrote).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from podnet.errors import PodnetError
from podnet.names import Keys, block_from_key, job_label, login_label, ptr_key, zone_path
from podnet.state import quota, store
from podnet.state.ipam import Ipam, PoolExhausted
from podnet.state.store import KV, Etcd, cmp_absent, cmp_value, op_count, op_delete, op_get, op_put

log = logging.getLogger("podnet.alloc")

RECORD_TTL = 30
MAX_ATTEMPTS = 20
#: in larger jobs only the first node allocates; the others wait for it (see allocate_job)
READ_FIRST_NODES = 16
#: seconds the other nodes of a large job wait for its first node's allocation
LEADER_WAIT = 3.0


class AllocError(RuntimeError):
    pass


class NoAddress(AllocError):
    """The pod network has no address left for this node (the request, not podnetd, fails)."""


@dataclass
class Job:
    job_id: int
    user: str
    uid: int
    name: str
    label: str
    nodes: list[str]
    ips: list[str]
    vni: int
    revision: int = 0
    created: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "user": self.user,
            "uid": self.uid,
            "name": self.name,
            "label": self.label,
            "nodes": self.nodes,
            "ips": self.ips,
            "vni": self.vni,
            "created": self.created,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], revision: int = 0) -> Job:
        return cls(
            job_id=int(d["job_id"]),
            user=str(d["user"]),
            uid=int(d["uid"]),
            name=str(d.get("name", "")),
            label=str(d["label"]),
            nodes=[str(n) for n in d["nodes"]],
            ips=[str(i) for i in d["ips"]],
            vni=int(d["vni"]),
            revision=revision,
            created=float(d.get("created", 0)),
        )


@dataclass
class Allocator:
    etcd: Etcd
    keys: Keys
    ipam: Ipam
    zone: str
    vni_min: int
    vni_max: int
    node_ips: dict[str, str] = field(default_factory=dict)

    @property
    def slots(self) -> quota.Slots:
        """Users' quota slots (state/quota.py)."""
        return quota.Slots(self.etcd, self.keys)

    # -- users -------------------------------------------------------------------------
    def user_vni(self, user: str, uid: int) -> int:
        """The user's VNI, allocated once for ever (create-if-absent)."""
        for _attempt in range(MAX_ATTEMPTS):
            kv = self.etcd.get(self.keys.user(user))
            if kv:
                return int(kv.json()["vni"])
            span = self.vni_max - self.vni_min + 1
            # start from a hash of the name so that users rarely race for the same VNI
            start = self.vni_min + (sum(user.encode()) * 2654435761 + uid) % span
            taken = {
                int(k.key.rsplit("/", 1)[-1])
                for k in self.etcd.get_prefix(self.keys.prefix("vnis"), keys_only=True)[0]
            }
            if len(taken) >= span:
                raise AllocError("no free VNI left in the configured range")
            vni = start
            while vni in taken:
                vni = self.vni_min + (vni - self.vni_min + 1) % span
            r = self.etcd.txn(
                [cmp_absent(self.keys.user(user)), cmp_absent(self.keys.vni(vni))],
                [
                    op_put(self.keys.user(user), {"vni": vni, "uid": uid}),
                    op_put(self.keys.vni(vni), {"user": user}),
                ],
            )
            if r.succeeded:
                log.info("user %s: VNI %d", user, vni)
                return vni
        raise AllocError(f"could not allocate a VNI for {user} (contention)")

    # -- views -------------------------------------------------------------------------
    def load_view(self, ips_seen: Callable[[list[KV]], None] | None = None) -> int:
        """(Re)load blocks and used IPs into the IPAM view; returns the etcd revision.
        `ips_seen` gets the `ips/` records (read with their values only then)."""
        blocks, rev = self.etcd.get_prefix(self.keys.prefix("blocks"))
        ips, rev2 = self.etcd.get_prefix(self.keys.prefix("ips"), keys_only=ips_seen is None)
        if ips_seen is not None:
            ips_seen(ips)
        with self.ipam.lock:
            self.ipam.used.clear()
            self.ipam.blocks.clear()
            self.ipam.node_blocks.clear()
            self.ipam.claims.clear()
        for kv in blocks:
            self.ipam.set_block(
                ipaddress.IPv4Network(block_from_key(kv.key)), str(kv.json().get("node"))
            )
        self.ipam.mark(k.key.rsplit("/", 1)[-1] for k in ips)
        return max(rev, rev2)

    # -- jobs --------------------------------------------------------------------------
    def get_job(self, job_id: int) -> Job | None:
        kv = self.etcd.get(self.keys.job(job_id))
        return Job.from_json(kv.json(), kv.mod_revision) if kv else None

    def allocate_job(
        self,
        job_id: int,
        user: str,
        uid: int,
        name: str,
        nodes: list[str],
        vni: int,
        node_index: int = 0,
    ) -> Job:
        """All IPs of a job, its record and its name in one transaction; idempotent.

        Each node's IP comes from that node's address blocks (a new block is claimed in
        the same transaction when a node has no free address), so hosts route a node's
        pods through that node. The transaction also takes the job name (newest job
        wins: the previous owner's name records go) and, when it loses because another
        node allocated the job first, returns that job (one round trip either way, so the
        first try reads nothing before). In jobs of more than `READ_FIRST_NODES` nodes
        only the first node (`node_index` 0) allocates at once; the others wait for its
        job record (`_await_job`: a read, then a watch on the record) and allocate
        themselves only if it never comes (first node slow or gone): all nodes start
        together, and hundreds of large transactions of which one wins cost etcd and the
        nodes more than the job's allocation itself (measured with `make bench-scale`).
        The pods' DNS records are written by each node with its pod (`publish_pod`).
        """
        if len(nodes) > READ_FIRST_NODES and node_index != 0:
            existing = self._await_job(job_id)
            if existing:
                return _same_job(existing, user, nodes)
        for attempt in range(MAX_ATTEMPTS):
            if attempt:
                existing = self.get_job(job_id)
                if existing:
                    return _same_job(existing, user, nodes)
            job = Job(
                job_id, user, uid, name, job_label(name), list(nodes), [], vni, created=time.time()
            )
            compare = [cmp_absent(self.keys.job(job_id))]
            ops: list[dict[str, Any]] = []
            new_blocks: list[tuple[ipaddress.IPv4Network, str]] = []
            job.ips = self._pick_ips(nodes, new_blocks)
            for blk, node in new_blocks:
                compare.append(cmp_absent(self.keys.block(str(blk))))
                ops.append(op_put(self.keys.block(str(blk)), {"node": node}))
            prefix = self.keys.prefix("ips")
            for node, ip in zip(nodes, job.ips, strict=True):
                compare.append(cmp_absent(prefix + ip))
                ops.append(
                    op_put(
                        prefix + ip,
                        f'{{"job_id":{job_id},"node":{json.dumps(node)},"vni":{vni}}}',
                    )
                )
            ops.append(op_put(self.keys.job(job_id), job.to_json()))
            # the job name is this job's now: the previous owner's records go with it
            ops.append(op_delete(self.name_records(user, job.label), prefix=True))
            ops.append(op_put(self.keys.name(user, job.label), name_owner(job_id)))
            try:
                r = self.etcd.txn(compare, ops, [op_get(self.keys.job(job_id))])
            except store.EtcdRequestError:
                self._release(job.ips, new_blocks)
                raise
            if r.succeeded:
                self.ipam.mark(job.ips)
                self.ipam.release_pending(job.ips)
                self.ipam.confirm_blocks(blk for blk, _node in new_blocks)
                job.revision = r.revision
                return job
            self._release(job.ips, new_blocks)
            got = r.range_kvs(0)
            if got:  # another node allocated the job
                return _same_job(Job.from_json(got[0].json(), got[0].mod_revision), user, nodes)
            # lost a race on an IP or a block: refresh the view and retry
            self.load_view()
            time.sleep(min(0.01 * (attempt + 1), 0.2))
        raise AllocError(f"could not allocate job {job_id} (contention)")

    def _await_job(self, job_id: int) -> Job | None:
        """The job record once the job's first node has written it, or None after
        `LEADER_WAIT` seconds: a read, then a watch on the record (`Etcd.get_or_wait`),
        two requests per waiting node however long the first node takes, and the record
        arrives as soon as it is written (reads backing off 2-64 ms sent 3-4 requests per
        node and saw it 37-40 ms late at the median, the watch 12-23 ms: the wait path of
        `make bench-scale`, docs/bench.md)."""
        wait = getattr(self.etcd, "get_or_wait", None)
        if wait is not None:
            kv = wait(self.keys.job(job_id), LEADER_WAIT)
            return Job.from_json(kv.json(), kv.mod_revision) if kv else None
        # a store without watches (the unit tests' in-memory etcd): short reads
        end = time.monotonic() + LEADER_WAIT
        pause = 0.002
        while True:
            job = self.get_job(job_id)
            if job is not None or time.monotonic() >= end:
                return job
            time.sleep(min(pause, max(0.0, end - time.monotonic())))
            pause = min(pause * 2, 0.064)

    def name_records(self, user: str, label: str) -> str:
        """SkyDNS prefix of a job name's records (`<label>.<user>.<zone>`)."""
        return f"{zone_path(self.zone)}/{user}/{label}/"

    def _pod_records(self, job: Job, index: int, node: str) -> tuple[str, list[str]]:
        """Keys of one pod's publication: (its record under the job name, [its record
        under the job id, its PTR, the node's marker])."""
        return f"{self.name_records(job.user, job.label)}pod{index}", [
            f"{zone_path(self.zone)}/{job.user}/{job.job_id}/pod{index}",
            ptr_key(job.ips[index]),
            self.keys.job_node(job.job_id, node),
        ]

    def _while_name_owner(
        self, job: Job, named: dict[str, Any], common: list[dict[str, Any]]
    ) -> None:
        """`named` + `common` if the job still owns its name, else `common` only."""
        self.etcd.txn(
            [cmp_value(self.keys.name(job.user, job.label), name_owner(job.job_id))],
            [named, *common],
            common,
        )

    def publish_pod(self, job: Job, index: int, node: str) -> None:
        """One round trip once this node's pod of `job` is built: its DNS records (under
        the job id, the PTR, and under the job name while the job owns the name) and the
        node's marker `jobnodes/<id>/<node>`."""
        named, (by_id, ptr, marker) = self._pod_records(job, index, node)
        rec = {"host": job.ips[index], "ttl": RECORD_TTL}
        host = f"pod{index}.{job.job_id}.{job.user}.{self.zone}"
        common = [
            op_put(by_id, rec),
            op_put(ptr, {"host": host, "ttl": RECORD_TTL}),
            op_put(marker, "1"),
        ]
        self._while_name_owner(job, op_put(named, rec), common)

    def unpublish_pod(self, job: Job, index: int, node: str) -> None:
        """Undo `publish_pod` (this node's pod could not be built)."""
        named, keys = self._pod_records(job, index, node)
        self._while_name_owner(job, op_delete(named), [op_delete(k) for k in keys])

    def leave_job(self, job_id: int, node: str) -> None:
        """This node's pod of the job is gone: drop its marker; the last node to leave
        releases the job (deletes are linearized: at least one node sees nobody left)."""
        r = self.etcd.txn(
            [],
            [
                op_delete(self.keys.job_node(job_id, node)),
                op_count(self.keys.prefix(f"jobnodes/{job_id}")),
                op_get(self.keys.job(job_id)),
            ],
        )
        if r.range_count(1) == 0:
            kvs = r.range_kvs(2)
            if kvs:
                self.release_job(Job.from_json(kvs[0].json(), kvs[0].mod_revision))

    def reclaim_job(self, job: Job, running: Callable[[int], bool]) -> Job:
        """Write back the records of a live job that etcd lost (restored to a snapshot
        older than the job: docs/admin-guide.md "Backup and restore"), from a node's own
        copy of the job record; idempotent, and another node of the job may do the same.

        Create-if-absent on everything: the job record, its addresses, the address blocks
        (for the nodes the record names), the user's VNI and, unless a newer job owns it,
        the job name. An address whose `ips/` record names a job that no longer runs
        (`running`) is a stale record of the snapshot (that job had released it before this
        one was allocated): that job's records are released first. Anything another owner
        holds (an address of a running job or a login, a block of another node, the VNI of
        another user) is never taken: AllocError says what. Returns the job record in
        etcd (this one, or the same job written by another of its nodes)."""
        for attempt in range(MAX_ATTEMPTS):
            existing = self.get_job(job.job_id)
            if existing:
                if existing.ips != job.ips or existing.vni != job.vni:
                    raise AllocError(f"job {job.job_id} is in etcd with other addresses")
                return _same_job(existing, job.user, job.nodes)
            compare = [cmp_absent(self.keys.job(job.job_id))]
            ops: list[dict[str, Any]] = []
            self._reclaim_user(job, compare, ops)
            blocks: dict[str, str] = {}
            stale = self._reclaim_addresses(job, running, blocks, compare, ops)
            if stale is not None:
                log.warning(
                    "job %d: releasing the stale records of job %d (not running) that hold "
                    "its address",
                    job.job_id,
                    stale.job_id,
                )
                self.release_job(stale)
                continue
            ops.append(op_put(self.keys.job(job.job_id), job.to_json()))
            self._reclaim_name(job, compare, ops)
            r = self.etcd.txn(compare, ops)
            if r.succeeded:
                self.ipam.mark(job.ips)
                for blk, node in blocks.items():
                    self.ipam.set_block(ipaddress.IPv4Network(blk), node)
                job.revision = r.revision
                return job
            time.sleep(min(0.01 * (attempt + 1), 0.2))
        raise AllocError(f"could not write job {job.job_id} back (contention)")

    def _reclaim_user(self, job: Job, compare: list[Any], ops: list[Any]) -> None:
        """The user's VNI as the job had it (created if absent, never another's)."""
        ukv = self.etcd.get(self.keys.user(job.user))
        if ukv is not None:
            if int(ukv.json()["vni"]) != job.vni:
                raise AllocError(f"{job.user} has VNI {ukv.json()['vni']} now, not {job.vni}")
            return
        vkv = self.etcd.get(self.keys.vni(job.vni))
        if vkv is not None:
            raise AllocError(f"VNI {job.vni} of {job.user} is taken: {vkv.value}")
        compare += [cmp_absent(self.keys.user(job.user)), cmp_absent(self.keys.vni(job.vni))]
        ops += [
            op_put(self.keys.user(job.user), {"vni": job.vni, "uid": job.uid}),
            op_put(self.keys.vni(job.vni), {"user": job.user}),
        ]

    def _reclaim_addresses(
        self,
        job: Job,
        running: Callable[[int], bool],
        blocks: dict[str, str],
        compare: list[Any],
        ops: list[Any],
    ) -> Job | None:
        """The job's addresses and their blocks (created if absent); returns a job that
        no longer runs whose stale record holds one of them (to release first)."""
        for node, ip in zip(job.nodes, job.ips, strict=True):
            blk = str(ipaddress.IPv4Network(f"{ip}/{self.ipam.block_prefix}", strict=False))
            if blk not in blocks:
                bkv = self.etcd.get(self.keys.block(blk))
                if bkv is None:
                    compare.append(cmp_absent(self.keys.block(blk)))
                    ops.append(op_put(self.keys.block(blk), {"node": node}))
                elif bkv.json().get("node") != node:
                    raise AllocError(f"block {blk} of {ip} belongs to {bkv.json().get('node')}")
                blocks[blk] = node
            ikv = self.etcd.get(self.keys.ip(ip))
            if ikv is not None:
                owner = _json_or_none(ikv.value)
                other = owner.get("job_id") if isinstance(owner, dict) else None
                if isinstance(other, int) and other != job.job_id and not running(other):
                    stale = self.get_job(other)
                    if stale is not None and ip in stale.ips:
                        return stale
                raise AllocError(f"address {ip} is taken: {ikv.value}")
            compare.append(cmp_absent(self.keys.ip(ip)))
            ops.append(
                op_put(
                    self.keys.ip(ip),
                    f'{{"job_id":{job.job_id},"node":{json.dumps(node)},"vni":{job.vni}}}',
                )
            )
        return None

    def _reclaim_name(self, job: Job, compare: list[Any], ops: list[Any]) -> None:
        """The job name is the job's again unless a newer job owns it (newest job wins,
        as in allocate_job)."""
        name_key = self.keys.name(job.user, job.label)
        nkv = self.etcd.get(name_key)
        holder = _json_or_none(nkv.value) if nkv else None
        hid = holder.get("job_id") if isinstance(holder, dict) else None
        if isinstance(hid, int) and hid > job.job_id:
            return
        compare.append(cmp_value(name_key, nkv.value) if nkv else cmp_absent(name_key))
        ops.append(op_delete(self.name_records(job.user, job.label), prefix=True))
        ops.append(op_put(name_key, name_owner(job.job_id)))

    def _pick_ips(
        self, nodes: list[str], new_blocks: list[tuple[ipaddress.IPv4Network, str]]
    ) -> list[str]:
        """One candidate address per node, from that node's blocks (claiming new ones)."""
        ips: list[str] = []
        try:
            for node in nodes:
                ip = self.next_address(node, new_blocks)
                if ip is None:
                    raise AllocError(f"no address in new block {new_blocks[-1][0]}")
                ips.append(ip)
        except PoolExhausted:
            self._release(ips, new_blocks)
            raise AllocError("the pod network has no free address block") from None
        except AllocError:
            self._release(ips, new_blocks)
            raise
        return ips

    def next_address(
        self, node: str, new_blocks: list[tuple[ipaddress.IPv4Network, str]]
    ) -> str | None:
        """A candidate address of the node's blocks; when they are full, a new block is
        claimed (appended to new_blocks; PoolExhausted when none is left) and asked again:
        None only if even the new block has no free address."""
        ip = self.ipam.candidate(node)
        if ip is None:
            self._claim_block(node, new_blocks)
            ip = self.ipam.candidate(node)
        return ip

    def _claim_block(
        self, node: str, new_blocks: list[tuple[ipaddress.IPv4Network, str]]
    ) -> ipaddress.IPv4Network:
        blk = self.ipam.claim_block(node)
        new_blocks.append((blk, node))
        return blk

    def _release(self, ips: list[str], new_blocks: list[tuple[ipaddress.IPv4Network, str]]) -> None:
        self.ipam.release_pending(ips)
        self.ipam.unclaim_blocks(blk for blk, _node in new_blocks)

    def release_job(self, job: Job) -> None:
        """Delete a job, its IPs, markers and DNS records (the name only if still ours)."""
        base = zone_path(self.zone) + f"/{job.user}"
        ops = [
            op_delete(self.keys.job(job.job_id)),
            op_delete(self.keys.prefix(f"jobnodes/{job.job_id}"), prefix=True),
            op_delete(f"{base}/{job.job_id}/", prefix=True),
        ]
        for ip in job.ips:
            ops.append(op_delete(self.keys.ip(ip)))
            ops.append(op_delete(ptr_key(ip)))
        name_key = self.keys.name(job.user, job.label)
        # the job-name records belong to the newest live job with that name
        name_ops = [op_delete(name_key), op_delete(self.name_records(job.user, job.label), True)]
        owner = [cmp_value(name_key, name_owner(job.job_id))]
        if len(ops) + len(name_ops) <= self.etcd.max_txn_ops:
            with contextlib.suppress(store.EtcdRequestError):  # too many ops: in batches
                self.etcd.txn(owner, ops + name_ops, ops)
                self.ipam.mark(job.ips, used=False)
                return
        self.etcd.put_many(ops)
        self.etcd.txn(owner, name_ops)
        self.ipam.mark(job.ips, used=False)

    # -- one address of a node (logins, containers) --------------------------------------
    def _place(
        self,
        node: str,
        records: Callable[[str], tuple[list[dict[str, Any]], list[dict[str, Any]]]],
        reads: list[dict[str, Any]],
    ) -> tuple[str | None, store.TxnResult]:
        """One attempt at an address of `node`'s blocks (claiming a block if they are full)
        and its records (`records(ip)`: what else to compare, what to put), in one
        transaction that creates the address if absent; (the address, or None when the
        transaction lost, and its result: `reads` are read when it lost)."""
        new_blocks: list[tuple[ipaddress.IPv4Network, str]] = []
        try:
            ip = self.next_address(node, new_blocks)
        except PoolExhausted:
            self._release([], new_blocks)
            raise NoAddress("the pod network has no free address block") from None
        if ip is None:
            raise NoAddress("no free address")
        compare, puts = records(ip)
        compare = [*compare, cmp_absent(self.keys.ip(ip))]
        ops = []
        for blk, n in new_blocks:
            compare.append(cmp_absent(self.keys.block(str(blk))))
            ops.append(op_put(self.keys.block(str(blk)), {"node": n}))
        r = self.etcd.txn(compare, ops + puts, reads)
        if r.succeeded:
            self.ipam.mark([ip])
            self.ipam.release_pending([ip])
            self.ipam.confirm_blocks(blk for blk, _n in new_blocks)
            return ip, r
        self._release([ip], new_blocks)
        return None, r

    # -- logins ------------------------------------------------------------------------
    def allocate_login(
        self,
        node: str,
        user: str,
        uid: int,
        vni: int,
        lease: int,
        limits: dict[str, int] | None = None,
    ) -> tuple[str, dict[str, int]]:
        """The login IP of `user` on `node` (on `lease`) and the quota slots it holds;
        idempotent. `limits` (kind -> limit: `logins`, `addresses`; None: not limited)
        are taken in the same transaction (QuotaExceeded when one is full)."""
        key = self.keys.login(node, user)
        for attempt in range(MAX_ATTEMPTS):
            kv = self.etcd.get(key)
            if kv:
                d = kv.json()
                return str(d["ip"]), quota.slots_of(d)
            claim = self.slots.claim(user, limits or {}, key, lease)

            def records(
                ip: str, claim: quota.Claim = claim
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
                ops = self.login_record_ops(node, user, uid, vni, ip, lease, claim.slots)
                return [cmp_absent(key), *claim.compare], [*claim.ops, *ops]

            ip, _r = self._place(node, records, [])
            if ip is not None:
                return ip, claim.slots
            self.load_view()
            time.sleep(min(0.01 * (attempt + 1), 0.2))
        raise AllocError(f"could not allocate a login address for {user} (contention)")

    def login_record_ops(
        self,
        node: str,
        user: str,
        uid: int,
        vni: int,
        ip: str,
        lease: int,
        slots: dict[str, int] | None = None,
    ) -> list[dict[str, Any]]:
        """The keys of a login pod, all on the node's lease: `logins/<node>/<user>` (with
        the quota slots it holds), its IP, `<node>.login.<user>.<zone>` and the PTR."""
        label = login_label(node)
        record: dict[str, Any] = {"ip": ip, "uid": uid}
        if slots:
            record["slots"] = slots
        return [
            op_put(self.keys.login(node, user), record, lease),
            op_put(
                self.keys.ip(ip), {"kind": "login", "node": node, "user": user, "vni": vni}, lease
            ),
            op_put(
                f"{zone_path(self.zone)}/{user}/login/{label}",
                {"host": ip, "ttl": RECORD_TTL},
                lease,
            ),
            op_put(
                ptr_key(ip), {"host": f"{label}.login.{user}.{self.zone}", "ttl": RECORD_TTL}, lease
            ),
        ]

    def republish_login(
        self,
        node: str,
        user: str,
        uid: int,
        vni: int,
        ip: str,
        lease: int,
        slots: dict[str, int],
    ) -> dict[str, int]:
        """A live login pod's records again (adoption after a restart, the node's new
        lease), with its quota slots (kept, or others if another login took them while
        the records were gone: a live pod is never refused). Returns the slots."""
        key = self.keys.login(node, user)
        for attempt in range(MAX_ATTEMPTS):
            kv = self.etcd.get(key)
            held = quota.slots_of(kv.json()) if kv else {}
            claim = self.slots.keep(user, held or slots, key, lease)
            r = self.etcd.txn(
                claim.compare,
                [*claim.ops, *self.login_record_ops(node, user, uid, vni, ip, lease, claim.slots)],
            )
            if r.succeeded:
                return claim.slots
            time.sleep(min(0.01 * (attempt + 1), 0.2))
        raise AllocError(f"could not write the login records of {user} (contention)")

    def release_login(self, node: str, user: str) -> None:
        key = self.keys.login(node, user)
        kv = self.etcd.get(key)
        if not kv:
            return
        d = kv.json()
        ip = str(d["ip"])
        self.etcd.put_many(
            [
                op_delete(key),
                op_delete(self.keys.ip(ip)),
                op_delete(ptr_key(ip)),
                op_delete(f"{zone_path(self.zone)}/{user}/login/{login_label(node)}"),
                *self.slots.release_ops(user, quota.slots_of(d)),
            ]
        )
        self.ipam.mark([ip], used=False)

    # -- containers --------------------------------------------------------------------
    def allocate_container(
        self,
        node: str,
        ns: str,
        user: str,
        vni: int,
        dns_name: str,
        record: dict[str, Any],
        limits: dict[str, int] | None = None,
    ) -> str:
        """An address of this node's block for the container `ns` and its records, one
        transaction (the address and the name are created if absent); returns the IP,
        also set as `record["ip"]` (the container's record, `Keys.container`).
        `dns_name`: `<label>.<user>.<zone>` (or "": none). `limits` (kind -> limit:
        `containers`, `addresses`; None: not limited): quota slots taken in the same
        transaction (QuotaExceeded when one is full), set as `record["slots"]`."""
        label = _label(dns_name)
        name_key = self.keys.name(user, label) if label else ""
        owner = self.keys.container(node, ns)

        for attempt in range(MAX_ATTEMPTS):
            claim = self.slots.claim(user, limits or {}, owner)
            if claim.slots:
                record["slots"] = claim.slots

            def records(
                ip: str, claim: quota.Claim = claim
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
                record["ip"] = ip
                claims = [op_put(name_key, container_owner(ns, node))] if name_key else []
                ops = self.container_record_ops(node, ns, user, vni, ip, dns_name, record)
                compare = [cmp_absent(name_key)] if name_key else []
                return [*compare, *claim.compare], [*claims, *claim.ops, *ops]

            ip, r = self._place(node, records, [op_get(name_key)] if name_key else [])
            if ip is not None:
                return ip
            if name_key and r.range_kvs(0):
                raise PodnetError(
                    "EEXIST", f"the name {label}.{user}.{self.zone} is taken (a job or container)"
                )
            self.load_view()
            time.sleep(min(0.01 * (attempt + 1), 0.2))
        raise AllocError(f"could not allocate a container address for {user} (contention)")

    def container_record_ops(
        self,
        node: str,
        ns: str,
        user: str,
        vni: int,
        ip: str,
        dns_name: str,
        record: dict[str, Any],
    ) -> list[dict[str, Any]]:
        """A container's keys: its IP, its record, `<label>/ctr` of its DNS name and the PTR."""
        label = _label(dns_name)
        ops = [
            op_put(
                self.keys.ip(ip),
                {"kind": "container", "node": node, "user": user, "vni": vni, "ns": ns},
            ),
            op_put(self.keys.container(node, ns), record),
        ]
        if label:
            ops.append(op_put(self._ctr_key(user, label), {"host": ip, "ttl": RECORD_TTL}))
            ops.append(op_put(ptr_key(ip), {"host": dns_name, "ttl": RECORD_TTL}))
        return ops

    def get_container(self, node: str, ns: str) -> dict[str, Any] | None:
        """The record of the container `ns` on `node` (None: etcd has none)."""
        kv = self.etcd.get(self.keys.container(node, ns))
        return None if kv is None else dict(kv.json())

    def republish_container(
        self,
        node: str,
        ns: str,
        user: str,
        vni: int,
        ip: str,
        dns_name: str,
        record: dict[str, Any],
    ) -> None:
        """The container's records again (adopted after a restart), with the quota slots
        `record` lists (kept, or others if they were taken meanwhile: a live container
        is never refused; `record["slots"]` is updated)."""
        owner = self.keys.container(node, ns)
        for attempt in range(MAX_ATTEMPTS):
            claim = self.slots.keep(user, quota.slots_of(record), owner)
            if claim.slots:
                record["slots"] = claim.slots
            ops = self.container_record_ops(node, ns, user, vni, ip, dns_name, record)
            if self.etcd.txn(claim.compare, [*claim.ops, *ops]).succeeded:
                return
            time.sleep(min(0.01 * (attempt + 1), 0.2))
        raise AllocError(f"could not write the records of container {ns} back (contention)")

    def container_names(self, node: str) -> list[str]:
        """The containers etcd has records of on `node` (their netns names)."""
        prefix = self.keys.container(node, "")
        kvs = self.etcd.get_prefix(prefix, keys_only=True)[0]
        return [kv.key[len(prefix) :] for kv in kvs]

    def release_container(
        self,
        node: str,
        ns: str,
        user: str,
        ip: str,
        dns_name: str,
        slots: dict[str, int] | None = None,
    ) -> None:
        """Delete a container's records, its name (while it is the container's) and the
        quota slots it holds."""
        label = _label(dns_name)
        ops = [
            op_delete(self.keys.ip(ip)),
            op_delete(self.keys.container(node, ns)),
            op_delete(ptr_key(ip)),
            *self.slots.release_ops(user, slots or {}),
        ]
        if label:
            ops.append(op_delete(self._ctr_key(user, label)))
            name_key = self.keys.name(user, label)
            # one round trip: the name's claim goes only while it is this container's
            self.etcd.txn(
                [cmp_value(name_key, container_owner(ns, node))], [*ops, op_delete(name_key)], ops
            )
        else:
            self.etcd.put_many(ops)
        self.ipam.mark([ip], used=False)

    def _ctr_key(self, user: str, label: str) -> str:
        """SkyDNS record of a container's name (`<label>.<user>.<zone>`)."""
        return f"{zone_path(self.zone)}/{user}/{label}/ctr"


def _label(dns_name: str) -> str:
    return dns_name.split(".", 1)[0] if dns_name else ""


def container_owner(ns: str, node: str) -> str:
    """Value of `names/<user>/<label>` a container holds (compared verbatim)."""
    return store.json_dumps({"container": ns, "node": node})


def name_owner(job_id: int) -> str:
    """Value of `names/<user>/<label>`: the job that owns the name (compared verbatim)."""
    return store.json_dumps({"job_id": job_id})


def _json_or_none(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return None


def _same_job(job: Job, user: str, nodes: list[str]) -> Job:
    if job.user != user or job.nodes != nodes:
        raise AllocError(f"job {job.job_id} already exists for another user or node list")
    return job
