# SPDX-License-Identifier: Apache-2.0
"""The node's pod network plane: the components the agent runs on once the cluster's
configuration is known, each built with everything it uses, in the order of what uses
what (no callback is set afterwards):

    allocator, dataplane, firewall, pod wiring        (state and kernel)
    ClusterView, SyncQueue                            (state.clusterview: the watches' view;
                                                       workqueue.py: the sync loop's work)
    UserNetworks(view)                                reads VNIs
    Overlay(dp, view)                                 resolves the VXLANs' misses
    Containers(nets, ...)
    Reconciler(nets, view, containers.adopt, ...)     adopts at start, collects garbage
    RecordRepair(work, ...)                           tamper repair of the watched records
    EtcdSync(view, work, repair, overlay, ...)        events -> view -> changes applied
    NodeLease, RecordGuard(reconcile.local.load,      tamper repair of the pods' records
        reconcile.reclaim_soon, ...)                  (a job's record gone: the reconciler)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from podnet.config import ClusterConfig, NodeConfig
from podnet.kernel.dataplane import Dataplane
from podnet.kernel.egress import ensure_egress_route, set_egress_route
from podnet.kernel.firewall import Firewall
from podnet.kernel.pidns import PidNamespaces
from podnet.names import Keys
from podnet.node.containers import Containers
from podnet.node.etcd_sync import EtcdSync
from podnet.node.overlay import Overlay
from podnet.node.pods import PodTable, PodWiring
from podnet.node.reconcile import Reconciler
from podnet.node.repair import RecordGuard, RecordRepair
from podnet.node.sessions import LoginSessions
from podnet.node.usernets import UserNetworks
from podnet.node.workqueue import SyncQueue
from podnet.state import quota
from podnet.state.alloc import Allocator
from podnet.state.clusterview import ClusterView
from podnet.state.ipam import Ipam
from podnet.state.node_lease import NodeLease
from podnet.state.store import Etcd


@dataclass
class NodePlane:
    cc: ClusterConfig
    alloc: Allocator
    dp: Dataplane
    fw: Firewall
    wiring: PodWiring
    view: ClusterView
    nets: UserNetworks
    sync: EtcdSync
    overlay: Overlay
    lease: NodeLease
    reconcile: Reconciler
    containers: Containers
    guard: RecordGuard

    @classmethod
    def build(
        cls,
        cfg: NodeConfig,
        cc: ClusterConfig,
        etcd: Etcd,
        pods: PodTable,
        sessions: LoginSessions,
        limits: Callable[[], quota.Limits],
        job_down: Callable[[int], object],
    ) -> NodePlane:
        """`limits`: the quotas now; `job_down`: the agent's (a lost job's pod, removed)."""
        keys = Keys(cfg.cluster)
        alloc = Allocator(
            etcd,
            keys,
            Ipam(cc.pod_cidr, cc.block_prefix),
            cc.zone,
            cc.vni_min,
            cc.vni_max,
        )
        dp = Dataplane(
            cfg.netns_dir,
            cfg.resolv_dir,
            cfg.underlay_interface,
            cfg.underlay_ip,
            cc.vxlan_port,
            cc.underlay_mtu,
            PidNamespaces(cfg.pidns_dir, cfg.pid_init),
        )
        gateway_node = "gateway" in cfg.roles
        fw = Firewall(
            cc.pod_cidr,
            cc.vxlan_port,
            cc.host_cidrs,
            cfg.host_uids,
            cc.other_vxlan_ports,
            cc.egress_gateway,
            cfg.underlay_interface,
            gateway_node,
        )
        set_egress_route(
            str(cc.pod_cidr), "" if gateway_node else cc.egress_gateway, cfg.underlay_interface
        )
        wiring = PodWiring(dp, fw, cc)
        view, work = ClusterView(cfg.node), SyncQueue()
        nets = UserNetworks(
            etcd,
            keys,
            alloc,
            dp,
            pods,
            cfg.node,
            cfg.underlay_ip,
            cfg.user_net_linger,
            view,
        )
        containers = Containers(
            cfg.node,
            cc,
            pods,
            nets,
            alloc,
            dp,
            wiring,
            cfg.containers_outside_jobs,
            frozenset({0, *cfg.host_uids}),
            limits,
            cfg.container_grace,
        )
        state = Path(cfg.state_dir)
        lease = NodeLease(
            etcd, keys, cfg.node, cfg.underlay_ip, cfg.roles, state, cc.login_lease_ttl
        )
        reconcile = Reconciler(
            cfg,
            cc,
            etcd,
            keys,
            alloc,
            dp,
            fw,
            pods,
            nets,
            view,
            sessions,
            lambda: lease.id,
            containers.adopt,
        )

        def egress_check() -> None:
            ensure_egress_route(cc.egress_gateway, cfg.underlay_interface)

        repair = RecordRepair(
            etcd,
            work,
            node=cfg.node,
            own_ips=lambda: [p.ip for p in pods.all()],
        )
        overlay = Overlay(dp, view)
        sync = EtcdSync(
            etcd,
            keys,
            cfg.node,
            alloc,
            dp,
            fw,
            pods,
            view,
            work,
            repair,
            overlay,
            on_idle=egress_check if cc.egress_gateway and not gateway_node else None,
        )
        guard = RecordGuard(
            etcd,
            keys,
            cfg.node,
            alloc,
            pods,
            reconcile.local.load,
            lambda: lease.id,
            on_job_lost=lambda _job_ids: reconcile.reclaim_soon(job_down),
        )
        return cls(
            cc,
            alloc,
            dp,
            fw,
            wiring,
            view,
            nets,
            sync,
            overlay,
            lease,
            reconcile,
            containers,
            guard,
        )
