#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The site's own Slurm of the site-install lane (issue 35): Slurm built in-house under
# /opt/slurm, the way many HPC sites run it, and another release than the nodes' Debian
# package (Debian 12 ships 22.05; this is 24.11, the upstream tarball of Debian 13's source
# package slurm-wlm, checked by its sha256 below). Test-only: tests/site-install/run.sh
# unpacks it on the lab's nodes after purging Debian's Slurm packages.
#
#   build-site-slurm.sh ROOTFS
#
# ROOTFS: the nodes' OS (the lab's bookworm image, .tar.zst or a directory; never modified).
# Builds inside it (systemd-nspawn, throw-away overlay, no network) with its gcc and
# libmunge-dev and libpmix-dev of its release (fetched by an apt of our own), `./configure --prefix=/opt/slurm
# --sysconfdir=/etc/slurm`, and writes $PODNET_CACHE_DIR/site-slurm/slurm-<version>-<inputs>.tar.zst:
# /opt/slurm (bin, sbin, lib, include, share/man) and the systemd units slurmctld, slurmd and
# sackd Slurm's build writes (etc/*.service, for /etc/systemd/system). Prints the tarball's path
# on its last line. Skipped when a tarball of the same inputs exists (this file, the source's
# sha256, the rootfs, the -dev .debs): ~10 min the first time on two cores.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=agent/artifacts/lib.sh
. "$here/../../agent/artifacts/lib.sh"
rootfs=${1:?usage: build-site-slurm.sh ROOTFS}
version=24.11.5
src_url=http://deb.debian.org/debian/pool/main/s/slurm-wlm/slurm-wlm_$version.orig.tar.gz
src_sha256=e1a5547edd212c38b5e3230a284133f777b32746551f094aaa81cc4af375e332
cache=${PODNET_CACHE_DIR:-/var/cache/podnet-dev}/site-slurm
die() { echo "build-site-slurm: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (systemd-nspawn)"
[ -e "$rootfs" ] || die "$rootfs: no such rootfs"
mkdir -p "$cache"
t0=$SECONDS

src=$cache/slurm-wlm_$version.orig.tar.gz
if ! echo "$src_sha256  $src" | sha256sum -c --status 2>/dev/null; then
    curl -sSf -o "$src.tmp" "$src_url" || die "cannot fetch $src_url"
    echo "$src_sha256  $src.tmp" | sha256sum -c --status || die "$src_url: sha256 is not $src_sha256"
    mv -f "$src.tmp" "$src"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/podnet-site-slurm.XXXXXX")
trap 'rm -rf --one-file-system "$work"' EXIT
root=$(rootfs_dir "$rootfs" "$work")
release=$(sed -n 's/^VERSION_CODENAME=//p' "$root/etc/os-release" | tr -d '"')
[ -n "$release" ] || die "$rootfs: no VERSION_CODENAME in /etc/os-release"
munge=$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Version}' libmunge2 2>/dev/null) \
    || die "$rootfs: libmunge2 is not installed (the site's Slurm authenticates with munge)"
pmix=$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Version}' libpmix2 2>/dev/null) \
    || die "$rootfs: libpmix2 is not installed (the site's Slurm starts MPI ranks with PMIx)"
mkdir -p "$work/debs"
debline="deb http://deb.debian.org/debian $release main"
{ apt_private "$work/apt" "$debline" update && (cd "$work/debs" && apt_private "$work/apt" "$debline" \
    download "libmunge-dev=$munge" "libpmix-dev=$pmix"); } >"$work/apt.log" 2>&1 \
    || { cat "$work/apt.log" >&2; die "libmunge-dev $munge or libpmix-dev $pmix: not in $release"; }

inputs=$( { echo "$src_sha256"; sha256sum "$work"/debs/*.deb | cut -d' ' -f1; rootfs_id "$rootfs"
            cat "${BASH_SOURCE[0]}" "$here/../../agent/artifacts/lib.sh"; } | sha256sum | cut -c1-16)
out=$cache/slurm-$version-$release-$inputs.tar.zst
exec 9>"$cache/.build.lock"
flock 9
if [ -s "$out" ]; then
    echo "site slurm: cached $(basename "$out")" >&2
    echo "$out"
    exit 0
fi
echo "site slurm: building Slurm $version for $release under /opt/slurm (inputs $inputs)" >&2
b=$work/build
mkdir -p "$b/pkg"
tar -C "$b" -xzf "$src"
mv "$b"/slurm-* "$b/src"
cp "$work"/debs/*.deb "$b/"
cat >"$b/build.sh" <<'EOF'
set -eu
# the headers only: their other -dev dependencies are not needed to build Slurm's plugins
dpkg -i --force-depends /podnet-build/*.deb >/dev/null 2>&1
cd /podnet-build/src
echo "build: $(date +%T) configure"
./configure -q --prefix=/opt/slurm --sysconfdir=/etc/slurm --runstatedir=/run \
    --with-munge --with-pmix=/usr/lib/x86_64-linux-gnu/pmix2 --disable-debug
echo "build: $(date +%T) make"
make -s -j"$(nproc)" >/dev/null
echo "build: $(date +%T) install"
make -s install DESTDIR=/podnet-build/pkg >/dev/null
# the site's units: Slurm's own, as its build writes them for this prefix
mkdir -p /podnet-build/pkg/etc/systemd/system
for u in slurmctld slurmd sackd; do cp "etc/$u.service" /podnet-build/pkg/etc/systemd/system/; done
find /podnet-build/pkg/opt/slurm -name '*.la' -delete
find /podnet-build/pkg/opt/slurm -type f -exec sh -c 'head -c4 "$1" | grep -q ELF && strip --strip-unneeded "$1"' _ {} \;
EOF
systemd-nspawn --quiet --register=no --keep-unit --private-network --volatile=overlay \
    --machine="pnsiteslurm-$$" -D "$root" --bind="$b:/podnet-build" \
    --setenv=LC_ALL=C.UTF-8 --setenv=HOME=/tmp --setenv=PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    sh /podnet-build/build.sh >"$work/make.log" 2>&1 || {
    tail -n 60 "$work/make.log" >&2
    cp "$work/make.log" "${TMPDIR:-/tmp}/podnet-site-slurm-make.log" || true
    die "build failed in $rootfs ($release)"
}
grep '^build: ' "$work/make.log" >&2
for f in sbin/slurmd include/slurm/spank.h lib/slurm/mpi_pmix.so; do
    [ -e "$b/pkg/opt/slurm/$f" ] || die "the build installed no /opt/slurm/$f"
done
tar -C "$b/pkg" --numeric-owner --owner=0 --group=0 --sort=name -cf - opt etc | zstd -q -T0 -3 -o "$out.tmp"
mv -f "$out.tmp" "$out"
echo "site slurm: $(basename "$out") ($(du -h "$out" | cut -f1)) in $((SECONDS - t0)) s" >&2
echo "$out"
