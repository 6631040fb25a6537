#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build the lab node image: a Debian rootfs (debootstrap minbase; trixie, or the
# release LAB_IMAGE_SUITE names) with every package of packages.txt preinstalled
# (nodes have no internet), the lab users, sshd settings and the daemons the roles
# configure left disabled.
#
#   build-image.sh OUTPUT.tar.zst
#
# Called by `lab.sh image|up` under a lock; the sha256 of packages.txt and of
# this file (and the release, for another than trixie) keys OUTPUT. Builds in a
# temporary directory next to OUTPUT and renames at the end, so an interrupted
# build never leaves a half image.
# Env: LAB_IMAGE_SUITE (trixie; bookworm: LAB_OS=bookworm, docs/lab.md),
#      LAB_MIRROR (default: the Debian mirror the host's apt sources use),
#      LAB_DEB_CACHE (default: <dir of OUTPUT>/debs, debs-<suite> for another suite).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:?usage: build-image.sh OUTPUT.tar.zst}
cache=$(dirname "$out")
suite=${LAB_IMAGE_SUITE:-trixie}
[[ $suite =~ ^(trixie|bookworm)$ ]] || { echo "build-image.sh: LAB_IMAGE_SUITE must be trixie or bookworm" >&2; exit 1; }
if [ "$suite" = trixie ]; then debs=${LAB_DEB_CACHE:-$cache/debs}; else debs=${LAB_DEB_CACHE:-$cache/debs-$suite}; fi

# The Debian archive URI the host's apt uses (one-line and deb822 formats);
# security and non-Debian sources are skipped.
host_debian_mirror() {
    local f uri
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$f" ] || continue
        uri=$(awk '$1 == "deb" {
                for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/ && $i !~ /=/) break;
                if ($i ~ /\/debian\/?$/) { print $i; exit } }' "$f")
        [ -n "$uri" ] && { echo "${uri%/}"; return; }
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        uri=$(awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) { print $i; exit } }' "$f")
        [ -n "$uri" ] && { echo "${uri%/}"; return; }
    done
    echo "http://deb.debian.org/debian"
}

mirror=${LAB_MIRROR:-$(host_debian_mirror)}
mapfile -t packages < <(grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$here/packages.txt" | tr -s ' \t' '\n')

mkdir -p "$cache" "$debs"
tmp=$(mktemp -d "$cache/build.XXXXXX")
cleanup() {
    local m
    # debootstrap mounts proc/sys/dev in the target; never rm -rf through a mount
    awk -v root="$tmp/" 'index($2, root) == 1 { print $2 }' /proc/mounts | sort -r \
        | while read -r m; do umount -l "$m" || true; done
    rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT
root=$tmp/rootfs

echo "lab image: debootstrap $suite from $mirror (deb cache $debs)" >&2
start=$SECONDS
# debootstrap's own resolver ignores virtual packages: bootstrap minbase, then
# let apt inside the new root install the list.
debootstrap --variant=minbase --cache-dir="$debs" "$suite" "$root" "$mirror" \
    >"$tmp/debootstrap.log" 2>&1 || {
    tail -n 30 "$tmp/debootstrap.log" >&2
    if [ -f "$root/debootstrap/debootstrap.log" ]; then tail -n 30 "$root/debootstrap/debootstrap.log" >&2; fi
    echo "lab image: debootstrap failed (log above)" >&2
    exit 1
}
echo "lab image: minbase done in $((SECONDS - start)) s; installing packages" >&2

in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive "$@"; }
mount --bind "$debs" "$root/var/cache/apt/archives"
mount -t proc proc "$root/proc"
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"   # start no daemon in the chroot
chmod 0755 "$root/usr/sbin/policy-rc.d"
if ! { in_root apt-get -q update && in_root apt-get -q -y --no-install-recommends install "${packages[@]}"; } \
        >"$tmp/apt.log" 2>&1; then
    tail -n 30 "$tmp/apt.log" >&2
    echo "lab image: apt-get install failed (log above)" >&2
    exit 1
fi
umount "$root/proc"
umount "$root/var/cache/apt/archives"
rm -f "$root/usr/sbin/policy-rc.d"
echo "lab image: packages installed at $((SECONDS - start)) s" >&2

# --- users: alice bob carol (plain), labadmin (podnet admin, sudo) ---------
in_root groupadd -g 2100 podnet-admins
for u in alice:2001 bob:2002 carol:2003; do
    in_root useradd -m -u "${u#*:}" -U -s /bin/bash "${u%%:*}"
done
in_root useradd -m -u 2100 -g podnet-admins -G sudo -s /bin/bash labadmin
for u in root alice bob carol labadmin; do
    in_root usermod -p '*' "$u"      # no password, not locked: key login only
done
install -m 0440 /dev/stdin "$root/etc/sudoers.d/labadmin" <<'EOF'
# lab image: the lab admin needs no password (keys only)
labadmin ALL=(ALL:ALL) NOPASSWD: ALL
EOF

# --- sshd -------------------------------------------------------------------
install -m 0644 /dev/stdin "$root/etc/ssh/sshd_config.d/00-podnet-lab.conf" <<'EOF'
# podnet lab node (tests/lab/build-image.sh)
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
EOF
rm -f "$root"/etc/ssh/ssh_host_*    # lab.sh generates keys per node
mkdir -p "$root/etc/systemd/system/ssh.service.d"
install -m 0644 /dev/stdin "$root/etc/systemd/system/ssh.service.d/podnet-lab-hostkeys.conf" <<'EOF'
# fallback: lab.sh writes per-node host keys before boot
[Service]
ExecStartPre=-/usr/bin/ssh-keygen -A
EOF

# --- services ---------------------------------------------------------------
# Daemons the roles configure and enable; off until then.
disable=(slurmd.service slurmctld.service etcd.service munge.service)
# Periodic jobs that have no business in a volatile lab node.
for t in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer \
         e2scrub_reap.service fstrim.timer systemd-timesyncd.service; do
    if [ -e "$root/usr/lib/systemd/system/$t" ] || [ -e "$root/lib/systemd/system/$t" ]; then
        disable+=("$t")
    fi
done
systemctl --root="$root" disable "${disable[@]}" >/dev/null 2>&1 || {
    echo "lab image: systemctl disable ${disable[*]} failed" >&2; exit 1; }
systemctl --root="$root" enable systemd-networkd.service >/dev/null 2>&1
# nspawn owns the console: no getty fighting for it
systemctl --root="$root" mask console-getty.service getty@tty1.service >/dev/null 2>&1 || true

# --- identity and leftovers -----------------------------------------------
: >"$root/etc/machine-id"                 # lab.sh writes one per node
rm -f "$root/var/lib/dbus/machine-id"
printf 'lab\n' >"$root/etc/hostname"
printf '# podnet lab nodes have no DNS upstream; names come from /etc/hosts\n' >"$root/etc/resolv.conf"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
       "$root"/var/cache/apt/archives/partial/* "$root"/var/log/*.log "$root"/var/log/apt/* \
       "$root/debootstrap"
printf 'podnet-lab image %s (%s)\npackages: %s\n' "$(basename "$out")" "$suite" "${packages[*]}" >"$root/etc/podnet-lab-image"

echo "lab image: packing $(du -sh --one-file-system "$root" | cut -f1)" >&2
tar -C "$root" --numeric-owner --xattrs --xattrs-include='*' --acls -cf - . \
    | zstd -q -T0 -3 -o "$tmp/rootfs.tar.zst"
mv -f "$tmp/rootfs.tar.zst" "$out"
echo "lab image: $out ($(du -h "$out" | cut -f1)) in $((SECONDS - start)) s" >&2
