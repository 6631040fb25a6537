#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks the slim CoreDNS artifact against a real etcd: podnet-style SkyDNS records (A,
# multi-A for a job name, PTR), cache expiry, health, ready, Prometheus metrics, and name
# privacy (plugin/privacy): CoreDNS and etcd in a network namespace of their own, asked
# by clients in namespaces that hold alice's pod address, bob's, an address etcd knows no
# owner of, and a host-side (underlay) address, as pods and nodes ask the cluster's DNS.
# Also runs the plugin's Go unit tests. Needs root (network namespaces). Builds the
# artifact first if needed.
#   tests/lab/test-coredns.sh        (prints "coredns: N passed, N failed")
#   PODNET_DNS_PRIVACY=off tests/lab/test-coredns.sh   the same checks without the plugin
#                                    in the Corefile (what every client saw before it)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$here/../../agent/artifacts/coredns
cache=${PODNET_CACHE_DIR:-/var/cache/podnet-dev}
privacy=${PODNET_DNS_PRIVACY:-on}
[ "$(id -u)" = 0 ] || { echo "test-coredns: needs root (network namespaces)" >&2; exit 1; }
"$here/../../agent/artifacts/build-artifacts.sh" >/dev/null
version=$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" { sub(/^v/, "", $3); print $3 }
               $1 == "github.com/coredns/coredns" { sub(/^v/, "", $2); print $2 }' "$src/go.mod" | head -n 1)
bin=$cache/artifacts/coredns-$version-linux-amd64
for t in etcd etcdctl dig getent setpriv; do
    command -v "$t" >/dev/null || { echo "test-coredns: $t missing" >&2; exit 1; }
done

# Namespaces and links of our own (unique per run: other checkouts may run this at once).
tag=pncd$$
srv=${tag}s
dir=$(mktemp -d /tmp/podnet-coredns-test.XXXXXX)
pids=()
clients=()
cleanup() {
    local p c
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    for c in "${clients[@]}"; do
        ip netns del "$tag$c" 2>/dev/null || true
        rm -rf "/etc/netns/$tag$c"
    done
    ip netns del "$srv" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
passed=0 failed=0
check() {   # check NAME EXPECTED ACTUAL
    if [ "$2" = "$3" ]; then
        echo "PASS $1"; passed=$((passed + 1))
    else
        printf 'FAIL %s\n  expected: %s\n  got:      %s\n' "$1" "$2" "$3"; failed=$((failed + 1))
    fi
}

# The server's namespace: a bridge with the DNS address (as a dns node's underlay); each
# client is a namespace with one address and a veth into the bridge (no NAT, no router:
# the source address CoreDNS sees is the client's, as for pods on the real network).
dns_ip=198.51.100.53
ip netns add "$srv"
ip -n "$srv" link set lo up
ip -n "$srv" link add br0 type bridge
ip -n "$srv" link set br0 up
ip -n "$srv" addr add "$dns_ip/32" dev br0
add_client() {   # add_client NAME IP: a namespace $tag<NAME> whose resolver is CoreDNS
    local ns=$tag$1
    ip netns add "$ns"
    clients+=("$1")
    ip -n "$ns" link set lo up
    ip link add "${tag}$1" type veth peer name eth0 netns "$ns"
    ip link set "${tag}$1" netns "$srv"
    ip -n "$srv" link set "${tag}$1" master br0 up
    ip -n "$ns" addr add "$2/32" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route add "$dns_ip/32" dev eth0
    ip -n "$srv" route add "$2/32" dev br0
    mkdir -p "/etc/netns/$ns"
    printf 'nameserver %s\noptions timeout:2 attempts:1\n' "$dns_ip" >"/etc/netns/$ns/resolv.conf"
}
alice_ip=198.18.0.9 alice_ip2=198.18.0.10 bob_ip=198.18.0.20 stranger_ip=198.18.0.99 host_ip=198.51.100.7
add_client a "$alice_ip"      # alice's job pod
add_client b "$bob_ip"        # bob's login pod
add_client u "$stranger_ip"   # a pod address etcd has no owner for (yet)
add_client h "$host_ip"       # a node's underlay: a host-side process (a user's cron job)

ip netns exec "$srv" etcd --name t --data-dir "$dir/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster t=http://127.0.0.1:2380 >"$dir/etcd.log" 2>&1 &
pids+=($!)
ectl() { ip netns exec "$srv" env ETCDCTL_API=3 etcdctl --endpoints=http://127.0.0.1:2379 "$@" >/dev/null; }
for _ in $(seq 100); do ectl endpoint health 2>/dev/null && break; sleep 0.1; done
# podnet's state (as podnetd writes it: docs/architecture.md "etcd layout")
ectl put /podnet/lab/users/alice '{"vni":4097,"uid":2001}'
ectl put /podnet/lab/users/bob '{"vni":4098,"uid":2002}'
ectl put /podnet/lab/ips/$alice_ip '{"job_id":5,"node":"c1","vni":4097}'
ectl put /podnet/lab/ips/$alice_ip2 '{"job_id":5,"node":"c2","vni":4097}'
ectl put /podnet/lab/ips/$bob_ip '{"kind":"login","node":"login","user":"bob","vni":4098}'
ectl put /skydns/lab/alice/myjob/pod0 '{"host":"198.18.0.9","ttl":30}'
ectl put /skydns/lab/alice/myjob/pod1 '{"host":"198.18.0.10","ttl":30}'
ectl put /skydns/lab/alice/5/pod0 '{"host":"198.18.0.9","ttl":30}'
ectl put /skydns/arpa/in-addr/198/18/0/9 '{"host":"pod0.5.alice.lab","ttl":30}'
ectl put /skydns/lab/bob/login/login '{"host":"198.18.0.20","ttl":30}'
ectl put /skydns/arpa/in-addr/198/18/0/20 '{"host":"login.login.bob.lab","ttl":30}'
ectl put /skydns/lab/alice/notes '{"text":"alice-secret-project"}'
# the site's public names: a service, and one that points at alice's pod
ectl put /skydns/lab/svc/nfs '{"host":"198.51.100.10"}'
ectl put /skydns/lab/svc/web '{"host":"pod0.myjob.alice.lab"}'

privacy_block=""
if [ "$privacy" = on ]; then
    privacy_block="privacy {
        pods 198.18.0.0/15
        state /podnet/lab/
    }"
fi
cat >"$dir/Corefile" <<EOF
lab:53 18.198.in-addr.arpa:53 {
    bind 127.0.0.1 $dns_ip
    errors
    health 127.0.0.1:8080
    ready 127.0.0.1:8181
    prometheus 127.0.0.1:9153
    etcd lab in-addr.arpa {
        endpoint http://127.0.0.1:2379
    }
    $privacy_block
    loadbalance
    cache 5
}
EOF
ip netns exec "$srv" "$bin" -conf "$dir/Corefile" >"$dir/coredns.log" 2>&1 &
pids+=($!)

http_get() {   # http_get PORT PATH: body of an HTTP/1.0 GET in the server's namespace
    local resp
    # shellcheck disable=SC2016  # $1/$2 expand in the inner bash
    resp=$(timeout 5 ip netns exec "$srv" bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" "$2" >&3
        cat <&3' _ "$1" "$2" 2>/dev/null) || return 1
    [[ ${resp%%$'\r'*} == *" 200 "* ]] || return 1
    printf '%s\n' "${resp#*$'\r\n\r\n'}"
}
for _ in $(seq 100); do http_get 8181 /ready >/dev/null && break; sleep 0.1; done

# q CLIENT ARGS...: the answers' data, sorted, on one line; st CLIENT ARGS...: the status.
# CLIENT: a, b, u, h (namespaces above), or "root"/"nobody": a process of that user on
# the DNS host itself, asking over loopback (src 127.0.0.1) or $dns_ip.
run() {
    case $1 in
        root) ip netns exec "$srv" "${@:2}" ;;
        nobody) ip netns exec "$srv" setpriv --reuid=65534 --regid=65534 --clear-groups "${@:2}" ;;
        *) ip netns exec "$tag$1" "${@:2}" ;;
    esac
}
q() { run "$1" dig +short +time=2 +tries=1 @"$dns_ip" "${@:2}" | sort | tr '\n' ' ' | sed 's/ $//'; }
st() { run "$1" dig +time=2 +tries=1 @"$dns_ip" "${@:2}" | sed -n 's/.*status: \([A-Z]*\),.*/\1/p'; }
xfr() {   # xfr CLIENT NAME QTYPE: "RCODE ANSWERS" of a zone transfer request over TCP (dig's
          # transfer mode prints no status)
    run "$1" python3 -c '
import socket, struct, sys
name, qtype, server = sys.argv[1], int(sys.argv[2]), sys.argv[3]
q = struct.pack("!6H", 0x5044, 0, 1, 0, 0, 0)
q += b"".join(bytes([len(x)]) + x.encode() for x in name.split(".")) + b"\0" + struct.pack("!2H", qtype, 1)
s = socket.create_connection((server, 53), 3)
s.sendall(struct.pack("!H", len(q)) + q)
def read(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise SystemExit("closed")
        b += c
    return b
r = read(struct.unpack("!H", read(2))[0])
rcode = {0: "NOERROR", 3: "NXDOMAIN", 5: "REFUSED", 4: "NOTIMP", 2: "SERVFAIL"}.get(r[3] & 15, str(r[3] & 15))
print(rcode, struct.unpack("!H", r[6:8])[0])
if bytes([198, 18, 0, 9]) in r[12:]:
    print("198.18.0.9")
' "$2" "$3" "$dns_ip" | tr '\n' ' ' | sed 's/ *$//'
}
metric() {   # metric NAME: sum of a counter over its labels
    http_get 9153 /metrics | awk -v n="$1" '$1 == n || index($1, n "{") == 1 { s += $2 } END { print s + 0 }'
}

plugins=$("$bin" -plugins)
check "plugins compiled in (etcd, privacy)" "yes yes" \
    "$(grep -qx etcd <<<"$plugins" && echo yes) $(grep -qx privacy <<<"$plugins" && echo yes)"
gotest=ok
(cd "$src" && PATH=/usr/local/go/bin:$PATH GOMODCACHE=${GOMODCACHE:-$cache/go/mod} \
    GOCACHE=${GOCACHE:-$cache/go/build} GOFLAGS=-mod=readonly \
    go test -count=1 ./plugin/privacy/ >"$dir/gotest.log" 2>&1) || gotest=$(cat "$dir/gotest.log")
check "privacy: Go unit tests" "ok" "$gotest"
check "privacy: gofmt clean" "" "$(cd "$src" && /usr/local/go/bin/gofmt -l . 2>&1)"

# -- the records, as their owner (alice's pod) and root on the DNS host ------------------
check "A pod0.myjob.alice.lab (alice's pod)" "198.18.0.9" "$(q a pod0.myjob.alice.lab A)"
check "multi-A myjob.alice.lab (all pods of the job)" "198.18.0.10 198.18.0.9" "$(q a myjob.alice.lab A)"
check "PTR of alice's address (alice's pod)" "pod0.5.alice.lab." "$(q a -x 198.18.0.9)"
check "getent hosts in alice's pod (her resolv.conf)" "198.18.0.9" \
    "$(run a getent hosts pod0.myjob.alice.lab | awk '{print $1}')"
check "NXDOMAIN for an unknown pod" "NXDOMAIN" "$(st a pod9.myjob.alice.lab A)"
check "root on the DNS host (loopback) sees alice's name" "198.18.0.9" \
    "$(run root dig +short +time=2 +tries=1 @127.0.0.1 pod0.myjob.alice.lab A)"
check "root on the DNS host (its own address) sees alice's name" "198.18.0.9" "$(q root pod0.myjob.alice.lab A)"
check "root on the DNS host, over TCP" "198.18.0.9" \
    "$(run root dig +tcp +short +time=2 +tries=1 @127.0.0.1 pod0.myjob.alice.lab A)"

# -- attacks: bob's pod, a host-side process, a pod etcd knows no owner of, a local user --
for c in b h u nobody; do
    case $c in b) who="bob's pod" ;; h) who="a host-side process" ;; u) who="an ownerless pod address" ;;
               nobody) who="a non-root user on the DNS host" ;; esac
    check "$who: A pod0.myjob.alice.lab is NXDOMAIN" "NXDOMAIN" "$(st "$c" pod0.myjob.alice.lab A)"
    check "$who: PTR of alice's address is NXDOMAIN" "NXDOMAIN" "$(st "$c" -x 198.18.0.9)"
done
check "root's loopback view is not a non-root user's (loopback, UDP)" "NXDOMAIN" \
    "$(run nobody dig +time=2 +tries=1 @127.0.0.1 pod0.myjob.alice.lab A | sed -n 's/.*status: \([A-Z]*\),.*/\1/p')"
check "... nor over TCP" "NXDOMAIN" \
    "$(run nobody dig +tcp +time=2 +tries=1 @127.0.0.1 pod0.myjob.alice.lab A | sed -n 's/.*status: \([A-Z]*\),.*/\1/p')"
check "bob: A of alice's job name (all her pods) is NXDOMAIN" "NXDOMAIN" "$(st b myjob.alice.lab A)"
check "bob: alice's job by id is NXDOMAIN" "NXDOMAIN" "$(st b pod0.5.alice.lab A)"
check "bob: ANY alice.lab is NXDOMAIN" "NXDOMAIN" "$(st b alice.lab ANY)"
check "bob: A alice.lab (her whole subtree) is NXDOMAIN" "NXDOMAIN" "$(st b alice.lab A)"
check "bob: wildcard *.alice.lab is NXDOMAIN" "NXDOMAIN" "$(st b '*.alice.lab' A)"
check "bob: upper case ALICE.lab is NXDOMAIN" "NXDOMAIN" "$(st b POD0.MYJOB.ALICE.LAB A)"
check "bob: AXFR alice.lab (TCP) is NXDOMAIN" "NXDOMAIN 0" "$(xfr b alice.lab 252)"
check "bob: IXFR alice.lab (TCP) is NXDOMAIN" "NXDOMAIN 0" "$(xfr b alice.lab 251)"
check "bob: AXFR lab (TCP) holds nothing of alice's" "" "$(xfr b lab 252 | grep -o 198.18.0.9 || true)"
check "bob: wildcard *.lab lists his own and public addresses only" "198.18.0.20 198.51.100.10" "$(q b '*.lab' A)"
check "bob: wildcard any.lab lists his own and public addresses only" "198.18.0.20 198.51.100.10" "$(q b any.lab A)"
check "bob: the apex lab lists his own and public addresses only" "198.18.0.20 198.51.100.10" "$(q b lab A)"
check "bob: a partial reverse name lists none of alice's" "" "$(q b 0.18.198.in-addr.arpa A | grep -o alice || true)"
check "bob: a public name pointing at alice's pod is NXDOMAIN" "NXDOMAIN" "$(st b web.svc.lab A)"
check "bob: TXT of alice's notes is NXDOMAIN" "NXDOMAIN" "$(st b notes.alice.lab TXT)"
check "bob: a key path in one label (alice/notes.lab) is NXDOMAIN" "NXDOMAIN" \
    "$(st b 'alice/notes.lab' TXT)"
check "bob: ... and yields no text of hers" "" "$(q b 'alice/notes.lab' TXT)"
check "bob: getent hosts of alice's name fails (exit 2)" "2" \
    "$(run b getent hosts pod0.myjob.alice.lab >/dev/null; echo $?)"
check "host-side: wildcard *.lab lists public addresses only" "198.51.100.10" "$(q h '*.lab' A)"

# -- what stays visible -----------------------------------------------------------------
check "bob: his own login name" "198.18.0.20" "$(q b login.login.bob.lab A)"
check "bob: PTR of his own address" "login.login.bob.lab." "$(q b -x 198.18.0.20)"
for c in a b h u; do
    check "public name from client $c" "198.51.100.10" "$(q "$c" nfs.svc.lab A)"
done
check "alice: the public name pointing at her pod" "198.18.0.9 pod0.myjob.alice.lab." "$(q a web.svc.lab A)"
check "alice: wildcard *.alice.lab lists her pods" "198.18.0.10 198.18.0.9" "$(q a '*.alice.lab' A)"
check "the zone's SOA for bob" "NOERROR" "$(st b lab SOA)"

# -- the cache: an answer cached for alice is checked again for bob ------------------------
hits0=$(metric coredns_cache_hits_total)
check "cache: alice asks web.svc.lab" "198.18.0.9 pod0.myjob.alice.lab." "$(q a web.svc.lab A)"
check "cache: root asks *.lab (every address)" "198.18.0.10 198.18.0.20 198.18.0.9 198.51.100.10 pod0.myjob.alice.lab." \
    "$(q root '*.lab' A | tr ' ' '\n' | sort -u | tr '\n' ' ' | sed 's/ $//')"
check "cache: bob asks web.svc.lab within the TTL: NXDOMAIN" "NXDOMAIN" "$(st b web.svc.lab A)"
check "cache: bob asks *.lab within the TTL: no address of alice's" "198.18.0.20 198.51.100.10" "$(q b '*.lab' A)"
check "cache: bob's answers came from the cache" "yes" \
    "$([ "$(metric coredns_cache_hits_total)" -ge $((hits0 + 2)) ] && echo yes || echo "no ($hits0 -> $(metric coredns_cache_hits_total))")"
check "cache: alice again after bob: her answer is whole" "198.18.0.9 pod0.myjob.alice.lab." "$(q a web.svc.lab A)"

# -- the watch: a new address of alice's, then gone ----------------------------------------
ectl put /podnet/lab/ips/$stranger_ip '{"kind":"container","user":"alice","vni":4097}'
for _ in $(seq 50); do [ "$(q u pod0.myjob.alice.lab A)" = 198.18.0.9 ] && break; sleep 0.1; done
check "watch: a new address of alice's sees her names" "198.18.0.9" "$(q u pod0.myjob.alice.lab A)"
ectl del /podnet/lab/ips/$stranger_ip
for _ in $(seq 50); do [ "$(st u pod0.myjob.alice.lab A)" = NXDOMAIN ] && break; sleep 0.1; done
check "watch: the address released, its names are gone" "NXDOMAIN" "$(st u pod0.myjob.alice.lab A)"

# -- the rest of CoreDNS -----------------------------------------------------------------
ectl put /podnet/lab/ips/198.18.0.19 '{"job_id":5,"node":"c1","vni":4097}'
ectl put /skydns/lab/alice/myjob/pod0 '{"host":"198.18.0.19"}'
sleep 6   # cache 5
check "updated record after the cache TTL" "198.18.0.19" "$(q a pod0.myjob.alice.lab A)"
check "health endpoint" "OK" "$(http_get 8080 /health)"
check "ready endpoint" "OK" "$(http_get 8181 /ready)"
metrics_text=$(http_get 9153 /metrics || true)
check "metrics endpoint counts requests" "yes" \
    "$(grep -q '^coredns_dns_requests_total' <<<"$metrics_text" && echo yes)"

if [ "$failed" != 0 ]; then tail -n 20 "$dir/coredns.log" >&2; fi
echo "coredns: $passed passed, $failed failed (privacy $privacy)"
[ "$failed" = 0 ]
