#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The lab node image with Slurm from Debian sid (LAB_SLURM=sid, docs/lab.md): the default
# image (build-image.sh) plus sid as an apt source pinned low (priority 100: nothing
# else moves to sid) and slurmd, slurmctld, slurm-client, libslurm-dev installed from sid
# (apt takes from sid only the dependencies trixie cannot satisfy). Slurm 26.05 has the
# namespace/linux plugin (docs/agent.md "PID namespace").
#
#   build-image-slurm-sid.sh BASE.tar.zst OUTPUT.tar.zst
#
# Called by `lab.sh image|up` under a lock with LAB_SLURM=sid; the sha256 of the base
# image's key and of this file keys OUTPUT. The default image is not touched.
# Env: LAB_MIRROR (default: the mirror of the base image's apt sources),
#      LAB_DEB_CACHE (default: <dir of OUTPUT>/debs).
set -euo pipefail
base=${1:?usage: build-image-slurm-sid.sh BASE.tar.zst OUTPUT.tar.zst}
out=${2:?usage: build-image-slurm-sid.sh BASE.tar.zst OUTPUT.tar.zst}
cache=$(dirname "$out")
debs=${LAB_DEB_CACHE:-$cache/debs}
slurm_packages=(slurmd slurmctld slurm-client libslurm-dev)

mkdir -p "$cache" "$debs"
tmp=$(mktemp -d "$cache/build-sid.XXXXXX")
cleanup() {
    local m
    awk -v root="$tmp/" 'index($2, root) == 1 { print $2 }' /proc/mounts | sort -r \
        | while read -r m; do umount -l "$m" || true; done
    rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT
root=$tmp/rootfs
start=$SECONDS
mkdir -p "$root"
tar -C "$root" --numeric-owner --xattrs --xattrs-include='*' --acls -I zstd -xpf "$base"

mirror=${LAB_MIRROR:-$(awk '$1 == "deb" { print $2; exit }' "$root/etc/apt/sources.list" 2>/dev/null || true)}
if [ -z "$mirror" ] && [ -r "$root/etc/apt/sources.list.d/debian.sources" ]; then
    mirror=$(awk 'tolower($1) == "uris:" { print $2; exit }' "$root/etc/apt/sources.list.d/debian.sources")
fi
mirror=${mirror:-http://deb.debian.org/debian}
# sid's Release files may be past Valid-Until between the archive's updates
echo "deb [check-valid-until=no] $mirror sid main" >"$root/etc/apt/sources.list.d/podnet-lab-sid.list"
install -m 0644 /dev/stdin "$root/etc/apt/preferences.d/podnet-lab-sid" <<'PIN'
# podnet lab (LAB_SLURM=sid): sid only for what is asked from it (Slurm and what it needs)
Package: *
Pin: release n=sid
Pin-Priority: 100
PIN

in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive "$@"; }
# the image has no DNS upstream (nodes use /etc/hosts): the host's, for apt only
mv "$root/etc/resolv.conf" "$tmp/resolv.conf.image"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
mount --bind "$debs" "$root/var/cache/apt/archives"
mount -t proc proc "$root/proc"
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 0755 "$root/usr/sbin/policy-rc.d"
sid_args=()
for p in "${slurm_packages[@]}"; do sid_args+=("$p/sid"); done
if ! { in_root apt-get -q update \
        && in_root apt-get -q -y --no-install-recommends install "${sid_args[@]}"; } >"$tmp/apt.log" 2>&1; then
    tail -n 30 "$tmp/apt.log" >&2
    echo "lab image (sid Slurm): apt-get install failed (log above)" >&2
    exit 1
fi
grep -E "^(Selected version|Inst )" "$tmp/apt.log" >&2 || true
umount "$root/proc"
umount "$root/var/cache/apt/archives"
rm -f "$root/usr/sbin/policy-rc.d"
mv -f "$tmp/resolv.conf.image" "$root/etc/resolv.conf"
systemctl --root="$root" disable slurmd.service slurmctld.service >/dev/null 2>&1 || true
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/apt/*
# shellcheck disable=SC2016  # dpkg-query's own ${field} syntax
printf 'slurm from sid: %s\n' "$(chroot "$root" dpkg-query -W -f='${Version}' slurmd)" \
    >>"$root/etc/podnet-lab-image"
tar -C "$root" --numeric-owner --xattrs --xattrs-include='*' --acls -cf - . \
    | zstd -q -T0 -3 -o "$tmp/rootfs.tar.zst"
mv -f "$tmp/rootfs.tar.zst" "$out"
echo "lab image (sid Slurm): $out ($(du -h "$out" | cut -f1)) in $((SECONDS - start)) s" >&2
