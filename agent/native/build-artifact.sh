#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# podnet's native binaries for one node platform, built once on a build machine (root,
# systemd-nspawn), not on every node:
#
#   build-artifact.sh ROOTFS OUTBASE
#
# ROOTFS: the nodes' OS as a directory or a .tar.zst/.tar.gz/.tar (a debootstrap of the
# nodes' release with gcc, make, libc6-dev, libpam0g-dev and the nodes' libslurm-dev; the
# lab's node image is one). It is never modified. Builds `make all` (podnet_spank.so,
# pam_podnet.so, podnet-init, podnet-image-exec, podnet-container, podnet-cni) inside it and writes
#   OUTBASE/podnet-native-<podnet version>-<release>-<arch>-slurm<major.minor>/
# with SHA256SUMS and PLATFORM (the key hpc.podnet.spank and hpc.podnet.sshd_hooks match
# against each node: a SPANK plugin loads only into the Slurm release it was built for).
# Skipped when that directory exists and was built from the same sources and rootfs.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
lib=$here/../artifacts/lib.sh
# shellcheck source=agent/artifacts/lib.sh
. "$lib"
rootfs=${1:?usage: build-artifact.sh ROOTFS OUTBASE}
outbase=${2:?usage: build-artifact.sh ROOTFS OUTBASE}
die() { echo "build-artifact: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (systemd-nspawn)"
command -v systemd-nspawn >/dev/null || die "needs systemd-nspawn (Debian: systemd-container)"
[ -e "$rootfs" ] || die "$rootfs: no such rootfs"

version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$here/../pyproject.toml" | head -n1)
[ -n "$version" ] || die "no version in agent/pyproject.toml"
# the library and program sources (not the unit tests and fuzz targets)
mapfile -t sources < <(cd "$here" && ls Makefile ./*.c ./*.h)
inputs=$( { (cd "$here" && cat "${sources[@]}"); rootfs_id "$rootfs"; cat "${BASH_SOURCE[0]}" "$lib"; } \
          | sha256sum | cut -c1-16)

work=$(mktemp -d "${TMPDIR:-/tmp}/podnet-native.XXXXXX")
trap 'rm -rf --one-file-system "$work"' EXIT
root=$(rootfs_dir "$rootfs" "$work")
# shellcheck disable=SC2016  # dpkg-query's own ${field} syntax
dpkgq() { dpkg-query --admindir="$root/var/lib/dpkg" -W -f="\${$1}" "$2" 2>/dev/null; }
release=$(sed -n 's/^VERSION_CODENAME=//p' "$root/etc/os-release" | tr -d '"')
arch=$(dpkgq Architecture libc6 || true)
slurm=$(dpkgq Version libslurm-dev || true)
[ -n "$release" ] || die "$rootfs: no VERSION_CODENAME in /etc/os-release"
[ -n "$arch" ] || die "$rootfs: libc6 is not installed (not a Debian rootfs?)"
[ -n "$slurm" ] || die "$rootfs: libslurm-dev is not installed (the SPANK plugin needs Slurm's headers)"
slurm=$(echo "$slurm" | sed -E 's/^([0-9]+:)?([0-9]+\.[0-9]+).*/\2/')
platform="$release-$arch-slurm$slurm"
out=$outbase/podnet-native-$version-$platform
if [ -f "$out/.inputs" ] && [ "$(cat "$out/.inputs")" = "$inputs" ]; then
    echo "native: cached $out"
    exit 0
fi

mkdir -p "$work/build/src" "$work/build/out"
(cd "$here" && cp "${sources[@]}" "$work/build/src/")
# the rootfs stays as it is: an overlay of it with a throw-away upper layer
systemd-nspawn --quiet --register=no --keep-unit --private-network --volatile=overlay \
    --machine="pnnative-$$" -D "$root" --bind="$work/build:/podnet-build" \
    --setenv=LC_ALL=C.UTF-8 \
    make -s -C /podnet-build/src O=/podnet-build/out all >"$work/make.log" 2>&1 || {
    cat "$work/make.log" >&2
    die "make failed in $rootfs ($platform)"
}
mkdir -p "$outbase"
tmp=$(mktemp -d "$outbase/.podnet-native.XXXXXX")
for f in podnet_spank.so pam_podnet.so podnet-init podnet-image-exec podnet-container podnet-cni; do
    install -m 0755 "$work/build/out/$f" "$tmp/$f"
done
chmod 0644 "$tmp/podnet_spank.so" "$tmp/pam_podnet.so"
(cd "$tmp" && sha256sum podnet_spank.so pam_podnet.so podnet-init podnet-image-exec podnet-container podnet-cni >SHA256SUMS)
printf '%s\n' "$platform" >"$tmp/PLATFORM"
echo "$inputs" >"$tmp/.inputs"
chmod 0755 "$tmp"
rm -rf "$out"
mv "$tmp" "$out"
echo "native: built $out"
