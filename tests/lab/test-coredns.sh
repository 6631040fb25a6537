#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks the slim CoreDNS artifact against a real etcd, on loopback only:
# podnet-style SkyDNS records (A, multi-A for a job name, PTR), health, ready
# and Prometheus metrics. Builds the artifact first if needed.
#   tests/lab/test-coredns.sh        (prints "coredns: N passed, N failed")
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${PODNET_CACHE_DIR:-/var/cache/podnet-dev}
"$here/../../agent/artifacts/build-artifacts.sh" >/dev/null
version=$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" { sub(/^v/, "", $3); print $3 }' "$here/../../agent/artifacts/coredns/go.mod")
bin=$cache/artifacts/coredns-$version-linux-amd64
for t in etcd etcdctl dig; do
    command -v "$t" >/dev/null || { echo "test-coredns: $t missing" >&2; exit 1; }
done

base=$(( 20000 + ($$ % 4000) * 6 ))      # six loopback ports of our own
client=$base peer=$((base + 1)) dns=$((base + 2)) health=$((base + 3)) metrics=$((base + 4)) ready=$((base + 5))
dir=$(mktemp -d /tmp/podnet-coredns-test.XXXXXX)
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
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

etcd --name t --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "t=http://127.0.0.1:$peer" >"$dir/etcd.log" 2>&1 &
pids+=($!)
ectl() { ETCDCTL_API=3 etcdctl --endpoints="http://127.0.0.1:$client" "$@"; }
for _ in $(seq 100); do ectl endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
ectl put /skydns/lab/alice/myjob/pod0 '{"host":"198.18.0.9"}' >/dev/null
ectl put /skydns/lab/alice/myjob/pod1 '{"host":"198.18.0.10"}' >/dev/null
ectl put /skydns/arpa/in-addr/198/18/0/9 '{"host":"pod0.myjob.alice.lab"}' >/dev/null

cat >"$dir/Corefile" <<EOF
lab:$dns 18.198.in-addr.arpa:$dns {
    bind 127.0.0.1
    errors
    health 127.0.0.1:$health
    ready 127.0.0.1:$ready
    prometheus 127.0.0.1:$metrics
    etcd lab in-addr.arpa {
        endpoint http://127.0.0.1:$client
    }
    loadbalance
    cache 5
}
EOF
"$bin" -conf "$dir/Corefile" >"$dir/coredns.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do http_get "$health" /health >/dev/null && break; sleep 0.1; done

http_get() {   # http_get PORT PATH: body of an HTTP/1.0 GET on loopback (no curl needed)
    local resp
    # shellcheck disable=SC2016  # $1/$2 expand in the inner bash
    resp=$(timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" "$2" >&3
        cat <&3' _ "$1" "$2" 2>/dev/null) || return 1
    [[ ${resp%%$'\r'*} == *" 200 "* ]] || return 1
    printf '%s\n' "${resp#*$'\r\n\r\n'}"
}
q() { dig +short +time=2 +tries=1 @127.0.0.1 -p "$dns" "$@" | sort | tr '\n' ' ' | sed 's/ $//'; }
plugins=$("$bin" -plugins)
check "plugins compiled in" "yes" "$(grep -qx etcd <<<"$plugins" && echo yes)"
check "A pod0.myjob.alice.lab" "198.18.0.9" "$(q pod0.myjob.alice.lab A)"
check "multi-A myjob.alice.lab (all pods of the job)" "198.18.0.10 198.18.0.9" "$(q myjob.alice.lab A)"
check "PTR 198.18.0.9" "pod0.myjob.alice.lab." "$(q -x 198.18.0.9)"
check "NXDOMAIN for an unknown pod" "NXDOMAIN" \
    "$(dig +time=2 +tries=1 @127.0.0.1 -p "$dns" pod9.myjob.alice.lab A | sed -n 's/.*status: \([A-Z]*\),.*/\1/p')"
ectl put /skydns/lab/alice/myjob/pod0 '{"host":"198.18.0.19"}' >/dev/null
sleep 6   # cache 5
check "updated record after the cache TTL" "198.18.0.19" "$(q pod0.myjob.alice.lab A)"
check "health endpoint" "OK" "$(http_get "$health" /health)"
check "ready endpoint" "OK" "$(http_get "$ready" /ready)"
metrics_text=$(http_get "$metrics" /metrics || true)
check "metrics endpoint counts requests" "yes" \
    "$(grep -q '^coredns_dns_requests_total' <<<"$metrics_text" && echo yes)"

if [ "$failed" != 0 ]; then tail -n 20 "$dir/coredns.log" >&2; fi
echo "coredns: $passed passed, $failed failed"
[ "$failed" = 0 ]
