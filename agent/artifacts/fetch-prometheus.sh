#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Prometheus for nodes without an apt source (the lab: hpc.podnet.prometheus with
# prometheus_install_method artifact), run by make artifacts:
#
#   fetch-prometheus.sh
#
# Writes $PODNET_CACHE_DIR/artifacts/prometheus-<version>.linux-amd64.tar.gz (+ .sha256), the
# layout of Prometheus's own release tarballs (prometheus and promtool under
# prometheus-<version>.linux-amd64/), made from Debian trixie's prometheus and promtool packages
# (Go, libc only; the same binaries as the package) reproducibly (sorted, owner 0, the
# packages' mtimes, gzip -n), by an apt of its own (the host's apt state is not touched).
# Skipped when a tarball and its .sha256 exist. A site with apt uses Debian's package (the
# role's default method); one with Prometheus's own tarball, that one and its checksum.
# Its own script, not a step of build-artifacts.sh, whose text keys the Go builds' caches.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=agent/artifacts/lib.sh
. "$here/lib.sh"
artifacts=${PODNET_CACHE_DIR:-/var/cache/podnet-dev}/artifacts
mkdir -p "$artifacts"
exec 9>"$artifacts/.prometheus.lock"
flock 9
out=$(find "$artifacts" -maxdepth 1 -name 'prometheus-*.linux-amd64.tar.gz' | sort | tail -n 1)
if [ -n "$out" ] && [ -s "$out.sha256" ]; then
    echo "prometheus release tarball: cached ($(basename "$out"))"
    exit 0
fi
tmp=$(mktemp -d "$artifacts/.promrel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
line="deb http://deb.debian.org/debian trixie main"
mkdir -p "$tmp/deb"
apt_private "$tmp" "$line" update >"$tmp/update.log" 2>&1 || { cat "$tmp/update.log" >&2; exit 1; }
(cd "$tmp/deb" && apt_private "$tmp" "$line" download prometheus promtool >"$tmp/download.log" 2>&1) \
    || { cat "$tmp/download.log" >&2; exit 1; }
deb=$(ls "$tmp"/deb/prometheus_*.deb)
version=$(dpkg-deb -f "$deb" Version)
up=${version%%[-+]*}
name=prometheus-$up.linux-amd64
mkdir -p "$tmp/x" "$tmp/t/$name"
for deb in "$tmp"/deb/prometheus_*.deb "$tmp"/deb/promtool_*.deb; do dpkg-deb -x "$deb" "$tmp/x"; done
for b in prometheus promtool; do
    [ -x "$tmp/x/usr/bin/$b" ] || { echo "prometheus release tarball: no $b in Debian's prometheus $version" >&2; exit 1; }
    cp -p "$tmp/x/usr/bin/$b" "$tmp/t/$name/$b"
done
touch -r "$tmp/x/usr/bin/prometheus" "$tmp/t/$name"
out=$artifacts/$name.tar.gz
tar -C "$tmp/t" --sort=name --owner=0 --group=0 --numeric-owner -cf - "$name" | gzip -n -9 >"$out.tmp"
mv -f "$out.tmp" "$out"
(cd "$artifacts" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256.tmp" && mv -f "$name.tar.gz.sha256.tmp" "$name.tar.gz.sha256")
echo "prometheus release tarball: $name.tar.gz (Debian $version) sha256 $(cut -d' ' -f1 "$out.sha256")"
