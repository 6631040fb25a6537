#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# podnet lab cluster: systemd-nspawn nodes booted from one Debian image (trixie; LAB_OS),
# on a private host bridge, reachable over SSH. See docs/lab.md.
#
#   lab.sh up | down | status | summary | ssh [USER@]NODE [CMD...] | image | inventory | ruleset
#
# Env: LAB_NAME (pnlab), LAB_NODES ("ctl login c1 c2"), LAB_SUBNET (198.51.100.0/26),
#      LAB_ETCD_NODES (ctl), LAB_INVENTORY, PODNET_CACHE_DIR (/var/cache/podnet-dev),
#      LAB_NSPAWN_ARGS (extra systemd-nspawn options for nodes booted by this up),
#      LAB_GATEWAYS (0; 1 adds gw1 gw2 ext and the external network LAB_EXT_SUBNET,
#      default 203.0.113.192/27, on a second bridge <LAB_NAME>bx0: docs/lab.md),
#      LAB_NODE_BASE (10: the first node's host number in LAB_SUBNET; 6 fits the 6 nodes
#      of a gateway lab into a /28),
#      LAB_DYNAMIC_NODES (""; compute nodes marked slurm_node_dynamic in the inventory:
#      Slurm dynamic nodes that playbooks/scale.yml adds later, tests/day2),
#      LAB_OS (trixie; bookworm: Debian 12 nodes with Slurm 22.05, their own image),
#      LAB_SLURM (trixie; sid: Slurm 26.05 from sid on trixie nodes),
#      LAB_PROMETHEUS (1: ctl in the prometheus group on trixie labs; 0: none, e.g. tests/day2).
set -euo pipefail

LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$LAB_DIR/../.." && pwd)

LAB_NAME=${LAB_NAME:-pnlab}
# which settings the caller gave (an existing lab otherwise keeps its own)
explicit=" ${LAB_NODES+LAB_NODES} ${LAB_SUBNET+LAB_SUBNET} ${LAB_ETCD_NODES+LAB_ETCD_NODES} ${LAB_GATEWAYS+LAB_GATEWAYS} ${LAB_EXT_SUBNET+LAB_EXT_SUBNET} ${LAB_DYNAMIC_NODES+LAB_DYNAMIC_NODES} ${LAB_NODE_BASE+LAB_NODE_BASE} ${LAB_SLURM+LAB_SLURM} ${LAB_OS+LAB_OS} "
LAB_NODES=${LAB_NODES:-ctl login c1 c2}
# Gateways (issue 11): gw1 gw2 (group gateway) with a second interface ext0 on the
# external bridge, and ext, a host outside the cluster on that bridge only.
LAB_GATEWAYS=${LAB_GATEWAYS:-0}
LAB_EXT_SUBNET=${LAB_EXT_SUBNET:-203.0.113.192/27}
LAB_DYNAMIC_NODES=${LAB_DYNAMIC_NODES:-}
LAB_NODE_BASE=${LAB_NODE_BASE:-10}     # nodes are .LAB_NODE_BASE, +1, ... of LAB_SUBNET
GW_NODES="gw1 gw2"
EXT_NODE=ext
LAB_SUBNET=${LAB_SUBNET:-198.51.100.0/26}
LAB_ETCD_NODES=${LAB_ETCD_NODES-__ctl__}  # default: the ctl node (see ctl_node), if any
LAB_CLUSTER=${LAB_CLUSTER:-lab}            # podnet_cluster_name (summary's DNS check)
LAB_NSPAWN_ARGS=${LAB_NSPAWN_ARGS:-}       # extra systemd-nspawn options, e.g. --bind=/dev/fuse
LAB_SLURM=${LAB_SLURM:-trixie}             # sid: the image with Slurm from Debian sid (26.05)
[[ $LAB_SLURM =~ ^(trixie|sid)$ ]] || { echo "lab.sh: LAB_SLURM must be trixie or sid, got '$LAB_SLURM'" >&2; exit 1; }
LAB_OS=${LAB_OS:-trixie}                   # bookworm: Debian 12 nodes (Slurm 22.05, Python 3.11)
[[ $LAB_OS =~ ^(trixie|bookworm)$ ]] || { echo "lab.sh: LAB_OS must be trixie or bookworm, got '$LAB_OS'" >&2; exit 1; }
CACHE=${PODNET_CACHE_DIR:-/var/cache/podnet-dev}/lab
STATE_ROOT=/var/lib/podnet-lab
STATE=$STATE_ROOT/$LAB_NAME
LOCK_DIR=/run/lock
BR=${LAB_NAME}br0
BX=${LAB_NAME}bx0    # the external network of the gateway lab (LAB_GATEWAYS=1)
NFT_TABLE=${LAB_NAME}_host
SSH_KEY=$STATE/ssh/id_ed25519
LAB_USERS="alice:2001 bob:2002 carol:2003 labadmin:2100"
if [ "$LAB_NAME" = pnlab ]; then
    DEFAULT_INVENTORY=$REPO/inventories/lab/hosts.yml
else
    DEFAULT_INVENTORY=$STATE/hosts.yml
fi
LAB_INVENTORY=${LAB_INVENTORY:-$DEFAULT_INVENTORY}
SSH_OPTS=(-i "$SSH_KEY" -o IdentitiesOnly=yes -o UserKnownHostsFile=/dev/null
          -o StrictHostKeyChecking=no -o LogLevel=ERROR -o BatchMode=yes -o ConnectTimeout=5)

say() { printf '%s: %s\n' "$LAB_NAME" "$*"; }
die() { printf 'lab.sh (%s): error: %s\n' "$LAB_NAME" "$*" >&2; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
elapsed() { local ms=$(( $(now_ms) - $1 )); printf '%d.%02d s' $((ms / 1000)) $(( (ms % 1000) / 10 )); }

# --- checks ------------------------------------------------------------------
require_root() {
    [ "$(id -u)" = 0 ] || die "run as root (the lab needs mounts, bridges, nftables and systemd-nspawn)"
}
require_tools() {
    command -v systemd-nspawn >/dev/null \
        || die "systemd-nspawn missing: apt-get install systemd-container"
    local t
    for t in "$@"; do
        command -v "$t" >/dev/null || die "$t missing (make host-deps installs the lab's host packages)"
    done
}
validate() {
    [ "$LAB_ETCD_NODES" != __ctl__ ] || LAB_ETCD_NODES=$(ctl_node)
    [[ $LAB_GATEWAYS =~ ^[01]$ ]] || die "LAB_GATEWAYS must be 0 or 1, got '$LAB_GATEWAYS'"
    [[ $LAB_OS =~ ^(trixie|bookworm)$ ]] || die "LAB_OS must be trixie or bookworm, got '$LAB_OS'"
    [ "$LAB_OS" = trixie ] || [ "$LAB_SLURM" = trixie ] \
        || die "LAB_SLURM=$LAB_SLURM needs LAB_OS=trixie (Slurm from sid is built on the trixie image)"
    add_gateway_nodes
    [[ $LAB_NAME =~ ^[a-z][a-z0-9]{0,11}$ ]] \
        || die "LAB_NAME '$LAB_NAME': use 1-12 of [a-z0-9], starting with a letter (bridge ${LAB_NAME}br0 must fit 15 chars)"
    local n seen=" "
    for n in $LAB_NODES; do
        [[ $n =~ ^[a-z][a-z0-9-]{0,30}$ ]] || die "node name '$n': use [a-z][a-z0-9-]*"
        [[ $seen == *" $n "* ]] && die "node '$n' listed twice in LAB_NODES"
        seen+="$n "
    done
    [ "$seen" != " " ] || die "LAB_NODES is empty"
    for n in $LAB_ETCD_NODES; do
        [[ $seen == *" $n "* ]] || die "LAB_ETCD_NODES: '$n' is not in LAB_NODES ($LAB_NODES)"
    done
    parse_subnet "$LAB_SUBNET"
    parse_ext_subnet
}
add_gateway_nodes() {   # LAB_GATEWAYS=1: gw1 gw2 ext join LAB_NODES (once)
    local n
    [ "$LAB_GATEWAYS" = 1 ] || return 0
    for n in $GW_NODES $EXT_NODE; do
        [[ " $LAB_NODES " == *" $n "* ]] || LAB_NODES+=" $n"
    done
}
is_gw() { [ "$LAB_GATEWAYS" = 1 ] && [[ " $GW_NODES " == *" $1 "* ]]; }
is_ext() { [ "$LAB_GATEWAYS" = 1 ] && [ "$1" = "$EXT_NODE" ]; }
cluster_nodes() {   # LAB_NODES without ext (ext is in no inventory group: outside the cluster)
    local n
    for n in $LAB_NODES; do is_ext "$n" || printf '%s ' "$n"; done
}
# The external network: host .1, the gateways' virtual address .2 (keepalived), gw1 .10,
# gw2 .11, ext .20. Cluster side: the gateways' virtual address is .5 of LAB_SUBNET.
parse_ext_subnet() {
    [ "$LAB_GATEWAYS" = 1 ] || return 0
    [[ $LAB_EXT_SUBNET =~ ^([0-9]{1,3}\.){3}[0-9]{1,3}/([0-9]{1,2})$ ]] \
        || die "LAB_EXT_SUBNET '$LAB_EXT_SUBNET' is not a.b.c.d/len"
    EXT_PREFIX=${LAB_EXT_SUBNET#*/}
    (( EXT_PREFIX >= 16 && EXT_PREFIX <= 27 )) || die "LAB_EXT_SUBNET prefix /$EXT_PREFIX: use /16 to /27"
    local mask=$(( (0xffffffff << (32 - EXT_PREFIX)) & 0xffffffff ))
    EXT_NET=$(( $(ip2int "${LAB_EXT_SUBNET%/*}") & mask ))
    [ "$(int2ip "$EXT_NET")/$EXT_PREFIX" = "$LAB_EXT_SUBNET" ] \
        || die "LAB_EXT_SUBNET '$LAB_EXT_SUBNET' has host bits set"
    EXT_HOST_IP=$(int2ip $((EXT_NET + 1)))
}
ext_ip() {   # ext_ip NODE -> its address on the external network (gw1, gw2, ext)
    case $1 in
        gw1) int2ip $((EXT_NET + 10)) ;;
        gw2) int2ip $((EXT_NET + 11)) ;;
        "$EXT_NODE") int2ip $((EXT_NET + 20)) ;;
        *) return 1 ;;
    esac
}
ext_vip() { int2ip $((EXT_NET + 2)); }
int_vip() { int2ip $((NET + 5)); }
ext_port() {   # host end of a gateway's ext0 veth (unique per lab and node, <= 15 chars)
    printf 'px%s' "$(printf '%s-%s' "$LAB_NAME" "$1" | sha256sum | cut -c1-11)"
}

# --- addresses ---------------------------------------------------------------
ip2int() { local IFS=.; read -r a b c d <<<"$1"; echo $(( (a << 24) | (b << 16) | (c << 8) | d )); }
int2ip() { echo "$(( ($1 >> 24) & 255 )).$(( ($1 >> 16) & 255 )).$(( ($1 >> 8) & 255 )).$(( $1 & 255 ))"; }
parse_subnet() {
    [[ $1 =~ ^([0-9]{1,3}\.){3}[0-9]{1,3}/([0-9]{1,2})$ ]] || die "LAB_SUBNET '$1' is not a.b.c.d/len"
    PREFIX=${1#*/}
    (( PREFIX >= 16 && PREFIX <= 28 )) || die "LAB_SUBNET prefix /$PREFIX: use /16 to /28"
    local mask=$(( (0xffffffff << (32 - PREFIX)) & 0xffffffff ))
    NET=$(( $(ip2int "${1%/*}") & mask ))
    BCAST=$(( NET | (~mask & 0xffffffff) ))
    [ "$(int2ip "$NET")/$PREFIX" = "$1" ] || die "LAB_SUBNET '$1' has host bits set (network is $(int2ip "$NET")/$PREFIX)"
    HOST_IP=$(int2ip $((NET + 1)))
    if ! [[ $LAB_NODE_BASE =~ ^[0-9]+$ ]] || (( LAB_NODE_BASE < 6 )); then
        die "LAB_NODE_BASE must be a number >= 6 (.1 is the host, .5 the gateways' address)"
    fi
    local count
    count=$(wc -w <<<"$(cluster_nodes)")   # ext is on the external network only
    # the last node is .(base + count - 1); it must be below the broadcast address
    (( NET + LAB_NODE_BASE - 1 + count < BCAST )) \
        || die "LAB_SUBNET $1 is too small for $count nodes (nodes start at .$LAB_NODE_BASE)"
}
node_ip() {   # node_ip NAME -> address by position in LAB_NODES (.10, .11, ...); ext: external
    local n i=0
    if is_ext "$1"; then ext_ip "$1"; return; fi
    for n in $LAB_NODES; do
        [ "$n" = "$1" ] && { int2ip $((NET + LAB_NODE_BASE + i)); return; }
        i=$((i + 1))
    done
    return 1
}
# Refuse a subnet that overlaps an address on any interface but our bridge
# (another lab, or the host's own networks).
check_subnet_free() {   # check_subnet_free [BRIDGE NET PREFIX NAME]
    local br=${1:-$BR} net=${2:-$NET} prefix=${3:-$PREFIX} what=${4:-LAB_SUBNET $LAB_SUBNET}
    local dev cidr a p m
    while read -r _ dev _ cidr _; do
        [ "$dev" = "$br" ] && continue
        a=$(ip2int "${cidr%/*}"); p=${cidr#*/}
        (( p < prefix )) && m=$p || m=$prefix
        m=$(( (0xffffffff << (32 - m)) & 0xffffffff ))
        if (( (a & m) == (net & m) )); then
            die "$what overlaps $cidr on $dev (another lab? pick another range)"
        fi
    done < <(ip -4 -o addr show)
}

# --- saved lab config (status/ssh/down use what up created) ------------------
load_saved() {
    if [ -f "$STATE/lab.env" ]; then
        # shellcheck source=/dev/null
        . "$STATE/lab.env"
    fi
    [ "$LAB_ETCD_NODES" != __ctl__ ] || LAB_ETCD_NODES=$(ctl_node)
    parse_subnet "$LAB_SUBNET"
    parse_ext_subnet
}
saved_var() {   # saved_var NAME: NAME's value in lab.env, not touching ours
    (
        # shellcheck source=/dev/null
        . "$STATE/lab.env"
        printf '%s\n' "${!1:-}"
    )
}
save_config() {
    printf 'LAB_NODES=%q\nLAB_SUBNET=%q\nLAB_ETCD_NODES=%q\nLAB_INVENTORY=%q\nLAB_IMAGE=%q\nLAB_GATEWAYS=%q\nLAB_EXT_SUBNET=%q\nLAB_DYNAMIC_NODES=%q\nLAB_NODE_BASE=%q\nLAB_SLURM=%q\nLAB_OS=%q\n' \
        "$LAB_NODES" "$LAB_SUBNET" "$LAB_ETCD_NODES" "$LAB_INVENTORY" "$IMAGE_HASH" \
        "$LAB_GATEWAYS" "$LAB_EXT_SUBNET" "$LAB_DYNAMIC_NODES" "$LAB_NODE_BASE" "$LAB_SLURM" "$LAB_OS" >"$STATE/lab.env.tmp"
    mv -f "$STATE/lab.env.tmp" "$STATE/lab.env"
}

# --- image -------------------------------------------------------------------
base_image_hash() { cat "$LAB_DIR/packages.txt" "$LAB_DIR/build-image.sh" | sha256sum | cut -c1-16; }
image_hash() {   # LAB_SLURM=sid, LAB_OS=bookworm: images of their own, the default one untouched
    if [ "$LAB_SLURM" = sid ]; then
        { base_image_hash; cat "$LAB_DIR/build-image-slurm-sid.sh"; } | sha256sum | cut -c1-16
    elif [ "$LAB_OS" != trixie ]; then
        { base_image_hash; echo "LAB_OS=$LAB_OS"; } | sha256sum | cut -c1-16
    else
        base_image_hash
    fi
}
ensure_image() {   # sets IMAGE_TARBALL
    IMAGE_TARBALL=$CACHE/rootfs-$IMAGE_HASH.tar.zst
    [ -s "$IMAGE_TARBALL" ] && return
    if [ "$LAB_SLURM" = sid ]; then
        # the default image first (this one is built on it)
        local sid_hash=$IMAGE_HASH sid_tarball=$IMAGE_TARBALL base_tarball
        IMAGE_HASH=$(base_image_hash)
        LAB_SLURM=trixie ensure_image
        base_tarball=$IMAGE_TARBALL
        IMAGE_HASH=$sid_hash IMAGE_TARBALL=$sid_tarball
        require_tools zstd flock
        local t0; t0=$(now_ms)
        (
            flock 9
            if [ ! -s "$IMAGE_TARBALL" ]; then
                say "building node image $IMAGE_HASH (Slurm from sid, on $base_tarball)"
                "$LAB_DIR/build-image-slurm-sid.sh" "$base_tarball" "$IMAGE_TARBALL"
            fi
        ) 9>"$CACHE/.build.lock"
        say "image ready in $(elapsed "$t0"): $IMAGE_TARBALL"
        return
    fi
    require_tools debootstrap zstd flock
    mkdir -p "$CACHE"
    local t0; t0=$(now_ms)
    (
        flock 9
        if [ ! -s "$IMAGE_TARBALL" ]; then
            say "building node image $IMAGE_HASH (debootstrap $LAB_OS, a few minutes)"
            LAB_IMAGE_SUITE=$LAB_OS "$LAB_DIR/build-image.sh" "$IMAGE_TARBALL"
        fi
    ) 9>"$CACHE/.build.lock"
    say "image ready in $(elapsed "$t0"): $IMAGE_TARBALL"
}
ensure_base() {    # sets BASE (unpacked, shared by every lab of this image)
    BASE=$STATE_ROOT/base-$IMAGE_HASH
    [ -e "$BASE/.complete" ] && return
    ensure_image
    mkdir -p "$STATE_ROOT"
    local t0; t0=$(now_ms)
    (
        flock 9
        if [ ! -e "$BASE/.complete" ]; then
            rm -rf --one-file-system "$BASE.tmp"
            mkdir -p "$BASE.tmp/rootfs"
            tar -C "$BASE.tmp/rootfs" --numeric-owner --xattrs --xattrs-include='*' --acls \
                -I zstd -xpf "$IMAGE_TARBALL"
            touch "$BASE.tmp/.complete"
            rm -rf --one-file-system "$BASE"
            mv "$BASE.tmp" "$BASE"
        fi
    ) 9>"$STATE_ROOT/base-$IMAGE_HASH.lock"
    say "base unpacked in $(elapsed "$t0"): $BASE"
}

# --- host network --------------------------------------------------------------
net_up() {
    if ! ip link show dev "$BR" >/dev/null 2>&1; then
        check_subnet_free
        # a fixed MAC (from the lab's name): a bridge otherwise takes its ports' lowest
        # MAC, which changes as nodes come and go, and the nodes' ARP entries for the
        # host go stale until they expire
        ip link add "$BR" address "$(printf '%s' "$LAB_NAME" | sha256sum |
            sed -E 's/^(..)(..)(..)(..)(..).*/02:\1:\2:\3:\4:\5/')" type bridge
    fi
    ip addr replace "$HOST_IP/$PREFIX" dev "$BR"
    ip link set dev "$BR" up
    if [ "$LAB_GATEWAYS" = 1 ]; then
        if ! ip link show dev "$BX" >/dev/null 2>&1; then
            check_subnet_free "$BX" "$EXT_NET" "$EXT_PREFIX" "LAB_EXT_SUBNET $LAB_EXT_SUBNET"
            ip link add "$BX" address "$(printf '%s-ext' "$LAB_NAME" | sha256sum |
                sed -E 's/^(..)(..)(..)(..)(..).*/02:\1:\2:\3:\4:\5/')" type bridge
        fi
        ip addr replace "$EXT_HOST_IP/$EXT_PREFIX" dev "$BX"
        ip link set dev "$BX" up
    fi
    nft_ruleset | nft -f -
}
# One atomic transaction: create-or-replace the lab's table. Bridged frames
# pass the inet forward hook (bridge-nf-call-iptables=1) with in/out = the
# bridge: accept those; drop anything routed between the lab and any other
# interface, whatever ip_forward and other tables say.
nft_ruleset() {
    cat <<EOF
table inet $NFT_TABLE
delete table inet $NFT_TABLE
table inet $NFT_TABLE {
    chain forward {
        type filter hook forward priority filter - 10; policy accept;
        iifname "$BR" oifname "$BR" counter accept comment "lab bridge-internal traffic"
        iifname "$BR" counter drop comment "never forward out of the lab"
        oifname "$BR" counter drop comment "never forward into the lab"
        iifname "$BX" oifname "$BX" counter accept comment "external bridge-internal traffic"
        iifname "$BX" counter drop comment "never forward out of the external network"
        oifname "$BX" counter drop comment "never forward into the external network"
    }
}
EOF
}

# --- nodes -------------------------------------------------------------------
node_dir() { echo "$STATE/nodes/$1"; }
node_pid() {   # prints the pid of the node's nspawn if it is running
    local pf pid
    pf=$(node_dir "$1")/pid
    [ -s "$pf" ] || return 1
    pid=$(<"$pf")
    [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "systemd-nspawn .*-M $LAB_NAME-$1 " || return 1
    echo "$pid"
}
# The container's PID 1 (child of nspawn, pid 1 in its own pid namespace)
# survives a SIGKILLed nspawn: record it (pid + start time, against pid reuse)
# so stop and restart can find an orphaned container.
proc_start() { awk '{ print $22 }' "/proc/$1/stat" 2>/dev/null; }
record_init() {   # record_init NODE NSPAWN_PID
    local c kids=()
    read -r -a kids < <(cat /proc/"$2"/task/*/children 2>/dev/null | tr '\n' ' ')
    for c in "${kids[@]}"; do
        if grep -Eq '^NSpid:[[:space:]]+[0-9]+[[:space:]]+1$' "/proc/$c/status" 2>/dev/null; then
            echo "$c $(proc_start "$c")" >"$(node_dir "$1")/init"
            return 0
        fi
    done
    return 1
}
init_pid() {   # prints the pid of the node's container init if it still runs
    local f pid start
    f=$(node_dir "$1")/init
    [ -s "$f" ] || return 1
    read -r pid start <"$f"
    [ -n "$pid" ] && [ "$(proc_start "$pid")" = "$start" ] || return 1
    echo "$pid"
}
kill_orphan() {   # kill_orphan NODE: SIGKILL a container whose nspawn is gone
    local pid bridge_port
    pid=$(init_pid "$1") || return 0
    say "$1: container init $pid outlived its nspawn: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    # its veth goes away with its network namespace, asynchronously
    bridge_port=$(ip -o link show master "$BR" 2>/dev/null | grep -c "vb-$LAB_NAME-$1" || true)
    for _ in $(seq 50); do
        [ "$bridge_port" = 0 ] && break
        sleep 0.1
        bridge_port=$(ip -o link show master "$BR" 2>/dev/null | grep -c "vb-$LAB_NAME-$1" || true)
    done
}
is_mounted() { mountpoint -q "$1"; }
# Each node boots in a cgroup of its own, podnet-lab/<LAB_NAME>-<node> of the host's cgroup v2
# hierarchy: nspawn (--keep-unit, no scope of its own) puts the container into "payload" below
# the cgroup it starts in, and unshares a cgroup namespace there, so each node sees its own
# root (its own /sys/fs/cgroup/unified in systemd's hybrid layout). Started from the host's
# root cgroup instead, every node of every lab shared one ("/payload"): one node's shutdown
# (its systemd removes the empty cgroups it sees) removed what another node had made there,
# e.g. podnetd's podnet-stepd. In the hybrid layout nspawn makes the same cgroups in the
# name=systemd hierarchy too: down removes the node's cgroup from both.
LAB_CGROUP_DIR=podnet-lab
cgroup_v2_mount() { awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts; }
cgroup_mounts() {   # the hierarchies where nspawn makes the nodes' cgroups
    awk '$3 == "cgroup2" || ($3 == "cgroup" && $4 ~ /(^|,)name=systemd(,|$)/) { print $2 }' /proc/self/mounts
}
node_cgroup() { echo "$LAB_CGROUP_DIR/$LAB_NAME-$1"; }
cgroup_lock() { exec 7>"$LOCK_DIR/podnet-lab-cgroup.lock"; flock 7; }   # podnet-lab/ is shared
cgroup_make() {   # cgroup_make NODE: the node's (empty) cgroup in the cgroup v2 hierarchy
    local v2
    v2=$(cgroup_v2_mount)
    [ -n "$v2" ] || { say "$1: warning: no cgroup v2 hierarchy; the node shares the host's cgroups"; return 0; }
    cgroup_remove "$1" || die "$1: its cgroup $(node_cgroup "$1") still has processes"
    ( cgroup_lock; mkdir -p "$v2/$(node_cgroup "$1")" )
}
cgroup_enter() {   # cgroup_enter NODE: moves this shell into the node's cgroup (if made)
    local v2
    v2=$(cgroup_v2_mount)
    [ -n "$v2" ] && [ -d "$v2/$(node_cgroup "$1")" ] || return 0
    echo "$BASHPID" >"$v2/$(node_cgroup "$1")/cgroup.procs"
}
cgroup_remove() {   # cgroup_remove NODE|GLOB: depth-first, in every hierarchy; the node is gone
    local h d i rc=0
    while read -r h; do
        for d in "$h/$LAB_CGROUP_DIR/$LAB_NAME-"$1; do
            [ -d "$d" ] || continue
            # a container's last processes may still be leaving their cgroups
            for i in $(seq 50); do
                find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
                [ -d "$d" ] || break
                sleep 0.1
            done
            if [ -d "$d" ]; then say "warning: cannot remove cgroup $d (processes left?)"; rc=1; fi
        done
        ( cgroup_lock; rmdir "$h/$LAB_CGROUP_DIR" 2>/dev/null || true )   # the last lab's
    done < <(cgroup_mounts)
    return "$rc"
}
# The cluster's shared file system (a site's home or parallel file system): one host
# directory bound at /shared in every cluster node. HPK keeps each user's state there
# (/shared/hpk/<user>, the lab's hpk_settings) and the site's images (/shared/images).
make_shared() {
    local u name uid
    install -d -m 0755 "$STATE/shared" "$STATE/shared/hpk" "$STATE/shared/images"
    for u in $LAB_USERS; do
        name=${u%%:*}; uid=${u#*:}
        [ -d "$STATE/shared/hpk/$name" ] || install -d -m 0700 -o "$uid" -g "$uid" "$STATE/shared/hpk/$name"
    done
}

write_node_files() {   # write_node_files NODE IP ROOT (the merged tree)
    local node=$1 ip=$2 root=$3 n u name uid home
    printf '%s\n' "$node" >"$root/etc/hostname"
    {
        printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n'
        if is_ext "$node"; then   # outside the cluster: knows itself and the gateways only
            printf '%s\t%s\n' "$ip" "$node"
            printf '%s\tgateway\n' "$(ext_vip)"
        else
            printf '%s\t%s-host\n' "$HOST_IP" "$LAB_NAME"
            for n in $(cluster_nodes); do printf '%s\t%s\n' "$(node_ip "$n")" "$n"; done
        fi
    } >"$root/etc/hosts"
    mkdir -p "$root/etc/systemd/network"
    local prefix=$PREFIX
    is_ext "$node" && prefix=$EXT_PREFIX
    cat >"$root/etc/systemd/network/10-podnet-lab-host0.network" <<EOF
# podnet lab ($LAB_NAME): static underlay address, no default route (no internet)
[Match]
Name=host0

[Network]
Address=$ip/$prefix
DHCP=no
LinkLocalAddressing=no
IPv6AcceptRA=no
EOF
    if is_gw "$node"; then
        cat >"$root/etc/systemd/network/10-podnet-lab-ext0.network" <<EOF
# podnet lab ($LAB_NAME): the gateway's leg on the external network, no default route
[Match]
Name=ext0

[Network]
Address=$(ext_ip "$node")/$EXT_PREFIX
DHCP=no
LinkLocalAddressing=no
IPv6AcceptRA=no
EOF
    fi
    if [ ! -s "$root/etc/machine-id" ]; then
        od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$root/etc/machine-id"
        echo >>"$root/etc/machine-id"
    fi
    if ! ls "$root"/etc/ssh/ssh_host_*_key >/dev/null 2>&1; then
        ssh-keygen -A -f "$root" >/dev/null
    fi
    for u in root:0 $LAB_USERS; do
        name=${u%%:*}; uid=${u#*:}
        if [ "$name" = root ]; then home=$root/root; else home=$root/home/$name; fi
        [ -d "$home" ] || continue
        install -d -m 0700 -o "$uid" -g "$(stat -c %g "$home")" "$home/.ssh"
        install -m 0600 -o "$uid" -g "$(stat -c %g "$home")" "$SSH_KEY.pub" "$home/.ssh/authorized_keys"
    done
}
wait_ssh() {   # wait_ssh IP TIMEOUT_S [PID]: SSH answers (gives up early if PID exits)
    local ip=$1 deadline=$(( SECONDS + $2 )) pid=${3:-}
    while (( SECONDS < deadline )); do
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
            return 1
        fi
        if timeout 1 bash -c "exec 3<>/dev/tcp/$ip/22" 2>/dev/null \
            && ssh "${SSH_OPTS[@]}" -o ConnectTimeout=2 "root@$ip" true 2>/dev/null; then
            return 0
        fi
        sleep 0.2
    done
    return 1
}
node_up() {    # node_up NODE: mount, configure, boot, wait for SSH (idempotent)
    local node=$1 ip nd root pid t0
    t0=$(now_ms)
    ip=$(node_ip "$node")
    nd=$(node_dir "$node"); root=$nd/root
    if pid=$(node_pid "$node"); then
        if wait_ssh "$ip" 10; then
            [ -s "$nd/init" ] || record_init "$node" "$pid" || true
            say "$node ($ip) already running, pid $pid, ssh ok"
            return 0
        fi
        die "$node ($ip) is running (pid $pid) but SSH does not answer; try: LAB_NAME=$LAB_NAME $0 down"
    fi
    kill_orphan "$node"
    mkdir -p "$nd/upper" "$nd/work" "$root"
    if [ -s "$nd/ip" ] && [ "$(<"$nd/ip")" != "$ip" ]; then
        die "$node was created with address $(<"$nd/ip"), LAB_NODES now gives $ip: run down first"
    fi
    echo "$ip" >"$nd/ip"
    is_mounted "$root" || mount -t overlay "$LAB_NAME-$node" \
        -o "lowerdir=$BASE/rootfs,upperdir=$nd/upper,workdir=$nd/work" "$root"
    write_node_files "$node" "$ip" "$root"
    cgroup_make "$node"
    local extra=() net=(--network-bridge="$BR") xport=""
    read -r -a extra <<<"$LAB_NSPAWN_ARGS"
    is_ext "$node" || extra+=(--bind="$STATE/shared:/shared")
    if is_ext "$node"; then
        net=(--network-bridge="$BX")
    elif is_gw "$node"; then   # a second veth, ext0 inside; its host end joins $BX below
        xport=$(ext_port "$node")
        net+=(--network-veth-extra="$xport:ext0")
    fi
    # (the subshell joins the node's cgroup and becomes nspawn: $! is nspawn's pid)
    (
        cgroup_enter "$node"
        exec setsid systemd-nspawn --quiet --boot --register=no --keep-unit --console=passive \
            --link-journal=no --resolv-conf=off --timezone=off "${extra[@]}" \
            "${net[@]}" -M "$LAB_NAME-$node" -D "$root"
    ) </dev/null >"$nd/console.log" 2>&1 8>&- &
    pid=$!
    echo "$pid" >"$nd/pid"
    if [ -n "$xport" ]; then
        local i
        for i in $(seq 100); do
            ip link show dev "$xport" >/dev/null 2>&1 && break
            sleep 0.1
        done
        ip link set dev "$xport" master "$BX" up \
            || die "$node: host end $xport of ext0 did not appear (log $nd/console.log)"
    fi
    if ! wait_ssh "$ip" 90 "$pid"; then
        tail -n 20 "$nd/console.log" >&2 || true
        kill -0 "$pid" 2>/dev/null || die "$node ($ip): systemd-nspawn exited (log $nd/console.log, above)"
        die "$node ($ip): no SSH after 90 s (pid $pid, log $nd/console.log)"
    fi
    record_init "$node" "$pid" || say "$node: warning: container init of nspawn $pid not found"
    say "$node ($ip) up in $(elapsed "$t0"), pid $pid"
}

# --- inventory -----------------------------------------------------------------
nodes_like() {   # nodes_like GLOB [EXCLUDE_GLOB]: nodes of LAB_NODES matching GLOB, one a line
    local n
    for n in $LAB_NODES; do
        # shellcheck disable=SC2053
        if [[ $n == $1 ]] && { [ -z "${2:-}" ] || [[ $n != $2 ]]; }; then echo "$n"; fi
    done
}
ctl_node() {     # the node that runs dns, gateway, slurmctld: "ctl", else the first ctl*
    if has_node ctl; then echo ctl; else nodes_like 'ctl*' | head -n 1; fi
}
write_inventory() {
    local n first_ctl group members tmp dir
    first_ctl=$(ctl_node)
    dir=$(dirname "$LAB_INVENTORY"); mkdir -p "$dir"
    tmp=$LAB_INVENTORY.tmp.$$
    {
        echo "---"
        echo "# Generated by tests/lab/lab.sh up (LAB_NAME=$LAB_NAME). Do not edit: rewritten on every up."
        echo "all:"
        echo "  children:"
        echo "    lab:"
        echo "      vars:"
        echo "        ansible_user: root"
        echo "        ansible_ssh_private_key_file: $SSH_KEY"
        echo "        ansible_ssh_common_args: -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o LogLevel=ERROR"
        echo "        ansible_python_interpreter: /usr/bin/python3"
        echo "        podnet_lab_name: $LAB_NAME"
        echo "        podnet_lab_slurm: $LAB_SLURM"
        echo "        podnet_lab_os: $LAB_OS"
        echo "        podnet_pki_dir: $STATE/pki"
        if [ "$LAB_GATEWAYS" = 1 ]; then
            echo "        podnet_lab_gateway_internal_vip: $(int_vip)"
            echo "        podnet_lab_gateway_external_vip: $(ext_vip)/$EXT_PREFIX"
            echo "        podnet_lab_gateway_external_host: $(ext_ip "$EXT_NODE")"
        fi
        echo "      hosts:"
        for n in $(cluster_nodes); do
            echo "        $n:"
            echo "          ansible_host: $(node_ip "$n")"
            echo "          podnet_underlay_ip: $(node_ip "$n")"
            if [[ " $LAB_DYNAMIC_NODES " == *" $n "* ]]; then
                echo "          slurm_node_dynamic: true"
            fi
        done
        echo "      children:"
        for group in etcd dns gateway slurmctld login compute prometheus; do
            case $group in
                etcd) members=$LAB_ETCD_NODES ;;
                dns | slurmctld) members=$first_ctl ;;
                # the lab's Prometheus (hpc.podnet.prometheus); not on Debian 12 labs (the
                # site install, tests/site-install, deploys what a site has: none), nor where
                # LAB_PROMETHEUS=0 (the day-2 lab: its tests are the playbooks')
                prometheus) members=""
                    [ "$LAB_OS" = trixie ] && [ "${LAB_PROMETHEUS:-1}" = 1 ] && members=$first_ctl ;;
                gateway) members=""; [ "$LAB_GATEWAYS" = 1 ] && members=$GW_NODES ;;
                login) members=$(nodes_like 'login*') ;;
                compute) members=$(nodes_like 'c*' 'ctl*') ;;
            esac
            echo "        $group:"
            if [ -z "$(echo "$members" | tr -d '[:space:]')" ]; then
                echo "          hosts: {}"
            else
                echo "          hosts:"
                for n in $members; do echo "            $n: {}"; done
            fi
        done
    } >"$tmp"
    mv -f "$tmp" "$LAB_INVENTORY"
    # Outside inventories/lab, make the inventory self-contained.
    if [ "$(cd "$dir" && pwd -P)" != "$(cd "$REPO/inventories/lab" && pwd -P)" ] && [ ! -e "$dir/group_vars" ]; then
        ln -s "$REPO/inventories/lab/group_vars" "$dir/group_vars"
        echo "$dir/group_vars" >"$STATE/group_vars.link"
    fi
    {
        echo "# ssh -F $STATE/ssh/config NODE"
        for n in $LAB_NODES; do
            printf 'Host %s %s-%s\n  HostName %s\n' "$n" "$LAB_NAME" "$n" "$(node_ip "$n")"
        done
        printf 'Host *\n  User root\n  IdentityFile %s\n  IdentitiesOnly yes\n  UserKnownHostsFile /dev/null\n  StrictHostKeyChecking no\n  LogLevel ERROR\n' "$SSH_KEY"
    } >"$STATE/ssh/config"
}

# --- commands ----------------------------------------------------------------
cmd_image() {   # prints the image tarball's path alone on stdout (progress on stderr)
    require_root
    [ "$LAB_OS" = trixie ] || [ "$LAB_SLURM" = trixie ] \
        || die "LAB_SLURM=$LAB_SLURM needs LAB_OS=trixie (Slurm from sid is built on the trixie image)"
    IMAGE_HASH=$(image_hash)
    ensure_image >&2
    echo "$IMAGE_TARBALL"
}

# Each node's systemd takes inotify instances of the host's root user; Debian's default of
# 128 stops the boot of nodes (systemd fails to start units) once about 25 are up, e.g. two
# CI labs beside a developer's. Raised (never lowered) for the running kernel only.
LAB_INOTIFY_INSTANCES=${LAB_INOTIFY_INSTANCES:-1024}
raise_inotify_instances() {
    local cur
    cur=$(cat /proc/sys/fs/inotify/max_user_instances)
    if [ "$cur" -lt "$LAB_INOTIFY_INSTANCES" ]; then
        echo "$LAB_INOTIFY_INSTANCES" >/proc/sys/fs/inotify/max_user_instances
        say "fs.inotify.max_user_instances raised from $cur to $LAB_INOTIFY_INSTANCES (lab nodes)"
    fi
}

cmd_up() {
    require_root
    require_tools ssh ssh-keygen nft ip flock zstd mountpoint
    validate
    local t0 n pids=() rc=0 saved_subnet="" saved_image="" saved_os=""
    t0=$(now_ms)
    mkdir -p "$LOCK_DIR" "$STATE_ROOT"
    exec 8>"$LOCK_DIR/podnet-lab-$LAB_NAME.lock"
    flock -n 8 || { say "another lab.sh up/down of $LAB_NAME is running; waiting"; flock 8; }
    raise_inotify_instances
    if [ -f "$STATE/lab.env" ]; then
        saved_subnet=$(saved_var LAB_SUBNET)
        saved_image=$(saved_var LAB_IMAGE)
        [[ $explicit == *" LAB_SUBNET "* ]] || LAB_SUBNET=$saved_subnet
        [[ $explicit == *" LAB_NODES "* ]] || LAB_NODES=$(saved_var LAB_NODES)
        [[ $explicit == *" LAB_ETCD_NODES "* ]] || LAB_ETCD_NODES=$(saved_var LAB_ETCD_NODES)
        [[ $explicit == *" LAB_GATEWAYS "* ]] || LAB_GATEWAYS=$(saved_var LAB_GATEWAYS)
        [[ $explicit == *" LAB_EXT_SUBNET "* ]] || LAB_EXT_SUBNET=$(saved_var LAB_EXT_SUBNET)
        [[ $explicit == *" LAB_DYNAMIC_NODES "* ]] || LAB_DYNAMIC_NODES=$(saved_var LAB_DYNAMIC_NODES)
        saved_base=$(saved_var LAB_NODE_BASE)
        saved_base=${saved_base:-10}
        [[ $explicit == *" LAB_NODE_BASE "* ]] || LAB_NODE_BASE=$saved_base
        [ "$saved_base" = "$LAB_NODE_BASE" ] \
            || die "lab exists with LAB_NODE_BASE=$saved_base (asked: $LAB_NODE_BASE): run down first"
        [[ $explicit == *" LAB_SLURM "* ]] || LAB_SLURM=$(saved_var LAB_SLURM)
        saved_os=$(saved_var LAB_OS)
        saved_os=${saved_os:-trixie}
        [[ $explicit == *" LAB_OS "* ]] || LAB_OS=$saved_os
        [ "$saved_os" = "$LAB_OS" ] || die "lab exists with LAB_OS=$saved_os (asked: $LAB_OS): run down first"
        LAB_GATEWAYS=${LAB_GATEWAYS:-0}
        LAB_EXT_SUBNET=${LAB_EXT_SUBNET:-203.0.113.192/27}
        LAB_SLURM=${LAB_SLURM:-trixie}
        LAB_OS=${LAB_OS:-trixie}
        [ "$saved_subnet" = "$LAB_SUBNET" ] \
            || die "lab exists with LAB_SUBNET=$saved_subnet (asked: $LAB_SUBNET): run down first"
        validate
    fi
    # before creating anything: another lab or host network on our subnet?
    ip link show dev "$BR" >/dev/null 2>&1 || check_subnet_free
    IMAGE_HASH=$(image_hash)
    if [ -n "$saved_image" ] && [ "$saved_image" != "$IMAGE_HASH" ]; then
        if [ -e "$STATE_ROOT/base-$saved_image/.complete" ]; then
            say "note: this lab runs image $saved_image; the current image is $IMAGE_HASH (down + up to switch)"
            IMAGE_HASH=$saved_image
        else
            die "this lab's base image $saved_image is gone: run down first"
        fi
    fi
    ensure_base
    mkdir -p "$STATE/nodes" "$STATE/ssh" "$STATE/pki"
    chmod 0700 "$STATE/ssh" "$STATE/pki"
    make_shared
    [ -s "$SSH_KEY" ] || ssh-keygen -q -t ed25519 -N '' -C "podnet-lab-$LAB_NAME" -f "$SSH_KEY"
    save_config
    net_up
    for n in $LAB_NODES; do
        node_up "$n" &
        pids+=($!)
    done
    for n in "${pids[@]}"; do wait "$n" || rc=1; done
    write_inventory
    (( rc == 0 )) || die "some nodes failed to come up (see above); lab.sh status / down"
    say "lab up in $(elapsed "$t0"): ${LAB_NODES// /, } on $BR ($HOST_IP/$PREFIX); inventory $LAB_INVENTORY"
}

stop_nodes() {
    local n pid pids=() deadline
    for n in "$@"; do
        if pid=$(node_pid "$n"); then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    deadline=$(( SECONDS + 20 ))
    for pid in "${pids[@]}"; do
        while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            say "pid $pid ignored SIGTERM for 20 s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
        fi
    done
    # a container left without its nspawn (nspawn SIGKILLed) dies too
    for n in "$@"; do kill_orphan "$n"; done
}

cmd_down() {
    require_root
    local t0 n nd m saved_nodes=""
    t0=$(now_ms)
    mkdir -p "$LOCK_DIR"
    exec 8>"$LOCK_DIR/podnet-lab-$LAB_NAME.lock"
    flock 8
    if [ -d "$STATE/nodes" ]; then
        saved_nodes=$(cd "$STATE/nodes" && ls)
        # shellcheck disable=SC2086
        stop_nodes $saved_nodes
        for n in $saved_nodes; do
            nd=$(node_dir "$n")
            if is_mounted "$nd/root"; then
                umount "$nd/root" 2>/dev/null || umount -l "$nd/root"
            fi
        done
    fi
    cgroup_remove '*' || true   # every node's, also of nodes no longer in LAB_NODES
    if ip link show dev "$BR" >/dev/null 2>&1; then ip link del "$BR"; fi
    if ip link show dev "$BX" >/dev/null 2>&1; then ip link del "$BX"; fi
    if nft list table inet "$NFT_TABLE" >/dev/null 2>&1; then nft delete table inet "$NFT_TABLE"; fi
    if [ -f "$STATE/lab.env" ]; then
        LAB_INVENTORY=$(saved_var LAB_INVENTORY)
    fi
    if [ -f "$STATE/group_vars.link" ]; then
        m=$(<"$STATE/group_vars.link")
        [ -L "$m" ] && rm -f "$m"
    fi
    if [ -f "$LAB_INVENTORY" ] && grep -q "^# Generated by tests/lab/lab.sh up (LAB_NAME=$LAB_NAME)" "$LAB_INVENTORY"; then
        if [ "$LAB_INVENTORY" != "$DEFAULT_INVENTORY" ]; then   # someone links it (molecule)
            printf -- '---\n# lab %s is down (tests/lab/lab.sh down)\nall: {}\n' "$LAB_NAME" >"$LAB_INVENTORY"
        else
            rm -f "$LAB_INVENTORY"
        fi
    fi
    if [ -d "$STATE" ]; then
        if awk -v s="$STATE/" 'index($2, s) == 1 { found = 1 } END { exit !found }' /proc/mounts; then
            die "mounts remain under $STATE; not removing it"
        fi
        rm -rf --one-file-system "$STATE"
    fi
    rm -f "$LOCK_DIR/podnet-lab-$LAB_NAME.lock"
    say "down in $(elapsed "$t0") (caches kept: $CACHE, $STATE_ROOT/base-*)"
}

ssh_ok() { ssh "${SSH_OPTS[@]}" -o ConnectTimeout=2 "root@$1" true 2>/dev/null; }

cmd_status() {
    load_saved
    if [ ! -d "$STATE/nodes" ]; then
        say "not up"
        return 0
    fi
    local n pid ip s br nft
    ip link show dev "$BR" >/dev/null 2>&1 && br="$BR up" || br="$BR missing"
    nft list table inet "$NFT_TABLE" >/dev/null 2>&1 && nft="table inet $NFT_TABLE" || nft="nft table missing"
    say "$br ($HOST_IP/$PREFIX), $nft, image ${LAB_IMAGE:-?}, inventory $LAB_INVENTORY"
    printf '%-10s %-16s %-8s %s\n' NODE IP PID SSH
    for n in $LAB_NODES; do
        ip=$(node_ip "$n")
        if pid=$(node_pid "$n"); then
            ssh_ok "$ip" && s=ok || s="no answer"
        else
            pid=-; s="stopped"
        fi
        printf '%-10s %-16s %-8s %s\n' "$n" "$ip" "$pid" "$s"
    done
}

indent() { local l; while IFS= read -r l; do printf '  %s\n' "$l"; done; }
on_node() {   # on_node NODE CMD: run CMD (a string) as root on NODE, 60 s cap
    timeout 60 ssh "${SSH_OPTS[@]}" "root@$(node_ip "$1")" "$2"
}
has_node() { [[ " $LAB_NODES " == *" $1 "* ]]; }

summary_etcd() {   # summary_etcd NODE: endpoint health through NODE's client port
    local ip
    ip=$(node_ip "$1")
    on_node "$1" "
        if ! systemctl is-active -q etcd; then echo 'not deployed'; exit 0; fi
        p=/etc/podnet/pki
        if [ -r \$p/admin.crt ]; then
            etcdctl --endpoints=https://$ip:2379 --cacert=\$p/ca.crt --cert=\$p/admin.crt --key=\$p/admin.key endpoint health 2>&1
        else
            etcdctl endpoint health 2>&1
        fi"
}
cmd_summary() {
    load_saved
    [ -d "$STATE/nodes" ] || { say "not up (tests/lab/lab.sh up)"; return 0; }
    cmd_status
    local ctl login out
    ctl=$(ctl_node)
    login=$(nodes_like 'login*' | head -n 1)
    [ -n "$login" ] || login=${ctl:-${LAB_NODES%% *}}
    echo
    # etcd
    if [ -n "$LAB_ETCD_NODES" ]; then
        out=$(summary_etcd "${LAB_ETCD_NODES%% *}" 2>&1) || true
    else
        out="no etcd node in this lab"
    fi
    printf 'etcd:      %s\n' "${out:-unreachable}"
    # CoreDNS
    if [ -n "$ctl" ]; then
        out=$(on_node "$ctl" "
            if ! command -v dig >/dev/null; then echo 'dig missing'; exit 0; fi
            a=\$(dig +short +time=2 +tries=1 @$(node_ip "$ctl") $LAB_CLUSTER. SOA 2>/dev/null)
            case \$a in ''|';'*) echo 'not deployed (no answer on $(node_ip "$ctl"):53)';; *) echo \"$LAB_CLUSTER. SOA \$a\";; esac" 2>&1) || true
        printf 'coredns:   %s\n' "${out:-unreachable}"
    fi
    # Slurm
    out=$(on_node "$login" "
        if [ ! -s /etc/slurm/slurm.conf ]; then echo 'not deployed'; exit 0; fi
        timeout 10 sinfo 2>&1" 2>&1) || true
    printf 'sinfo (%s):\n%s\n' "$login" "$(indent <<<"${out:-unreachable}")"
    out=$(on_node "$login" "
        if [ ! -s /etc/slurm/slurm.conf ]; then echo 'not deployed'; exit 0; fi
        cd /tmp && timeout 40 runuser -u alice -- srun -N2 -t 1 hostname 2>&1 | sort" 2>&1) || true
    printf 'srun -N2 hostname as alice (%s):\n%s\n' "$login" "$(indent <<<"${out:-unreachable}")"
    # Extension point: every tests/lab/summary.d/*.sh adds its own lines
    # (best effort: print "not deployed" rather than fail).
    local f
    for f in "$LAB_DIR"/summary.d/*.sh; do
        [ -e "$f" ] || continue
        out=$(LAB_NAME=$LAB_NAME LAB_STATE=$STATE LAB_SSH_KEY=$SSH_KEY LAB_INVENTORY=$LAB_INVENTORY \
              LAB_NODES=$LAB_NODES LAB_CTL=$ctl LAB_LOGIN=$login LAB_SH=$LAB_DIR/lab.sh \
              timeout 120 bash "$f" 2>&1) || out+=" (check $(basename "$f") failed)"
        printf '%s\n' "$out"
    done
}

cmd_ssh() {
    load_saved
    [ -f "$STATE/lab.env" ] || die "lab $LAB_NAME is not up"
    local target=${1:?usage: lab.sh ssh [USER@]NODE [CMD...]} user=root node ip
    shift
    if [[ $target == *@* ]]; then user=${target%@*}; node=${target#*@}; else node=$target; fi
    ip=$(node_ip "$node") || die "no node '$node' in this lab ($LAB_NODES)"
    local tty=()
    [ $# -eq 0 ] && [ -t 0 ] && tty=(-t)
    exec ssh "${SSH_OPTS[@]}" "${tty[@]}" "$user@$ip" "$@"
}

case ${1:-} in
    up) cmd_up ;;
    down) cmd_down ;;
    status) require_root; cmd_status ;;
    summary) require_root; cmd_summary ;;
    ssh) require_root; shift; cmd_ssh "$@" ;;
    image) cmd_image ;;
    ruleset) validate; nft_ruleset ;;   # the host table up installs (tests/lab/test-host-guard.sh)
    inventory) load_saved; echo "$LAB_INVENTORY" ;;
    *) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
