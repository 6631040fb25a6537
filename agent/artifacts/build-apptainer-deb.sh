#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Apptainer for Debian releases whose glibc is older than the one Debian sid's apptainer .deb
# needs (Debian 12 bookworm: glibc 2.36, sid's build wants >= 2.38; no bookworm(-backports)
# package exists). Built once on a build machine (root, systemd-nspawn), not on the nodes:
#
#   build-apptainer-deb.sh ROOTFS
#
# ROOTFS: the nodes' OS as a directory or a .tar.zst/.tar.gz/.tar (a debootstrap of the nodes'
# release with gcc, make and libc6-dev: the lab's bookworm node image is one); never modified.
# Writes $PODNET_CACHE_DIR/artifacts/apptainer_<version>+podnet1~deb<N>_amd64.deb (+ .sha256),
# <version> = apptainer_version of roles/apptainer (Debian's 1.4.5-2), N = the release's major
# (12): the artifact hpc.podnet.apptainer installs on nodes of that release.
#
# What it builds, and from where (docs/install.md "Apptainer on Debian 12"):
# - the source: Debian sid's source package apptainer=<version> (the upstream release tarball
#   as Debian ships it + debian/), fetched by an apt of its own (deb-src sid, signatures checked
#   against the host's Debian keyring). The Go module proxy refuses apptainer 1.4.4 and later
#   (403), and Debian's own build (dh-golang against sid's golang-*-dev packages) cannot be met
#   on bookworm, so: Debian's upstream tarball, upstream's build system (mconfig), upstream's
#   go.mod/go.sum for the Go dependencies (from the Go module proxy, checked against go.sum),
#   and Debian's patch that points the CNI plugin path at /usr/lib/cni.
# - configured like Debian's package: --without-suid --without-network (Debian's
#   containernetworking-plugins), prefix /usr, libexec /usr/lib/x86_64-linux-gnu, seccomp on
#   (the release's libseccomp-dev, fetched the same way and installed in a throw-away overlay).
# - inside ROOTFS (systemd-nspawn, overlay, no network) so it links against that release's
#   glibc; Go from the host (/usr/local/go, bind-mounted read-only), module cache read-only.
# - packaged with dpkg-deb: the file layout, conffiles and singularity alternative of sid's
#   package; Depends: what sid's declares, libc6 from the glibc symbols the binaries use.
#   Reproducible as far as Go allows (-trimpath, mconfig --reproducible, mtimes =
#   SOURCE_DATE_EPOCH = the Debian changelog's date, sorted tar, owner root).
# Skipped when the .deb exists and was built from the same inputs (.inputs beside it: the
# Debian source's .dsc, the libseccomp-dev .deb, the rootfs, go version, this script).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=agent/artifacts/lib.sh
. "$here/lib.sh"
rootfs=${1:?usage: build-apptainer-deb.sh ROOTFS}
cache=${PODNET_CACHE_DIR:-/var/cache/podnet-dev}
artifacts=$cache/artifacts
die() { echo "build-apptainer-deb: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (systemd-nspawn, apt)"
command -v systemd-nspawn >/dev/null || die "needs systemd-nspawn (Debian: systemd-container)"
export PATH=/usr/local/go/bin:$PATH
command -v go >/dev/null || die "go missing (expected /usr/local/go/bin/go)"
[ -e "$rootfs" ] || die "$rootfs: no such rootfs"
export GOMODCACHE=${GOMODCACHE:-$cache/go/mod} GOTOOLCHAIN=local GOFLAGS="-mod=readonly -modcacherw"
mkdir -p "$artifacts" "$GOMODCACHE"
t0=$SECONDS

version=$(awk '$1 == "apptainer_version:" { gsub(/"/, "", $2); print $2 }' "$here/../../roles/apptainer/defaults/main.yml")
[ -n "$version" ] || die "no apptainer_version in roles/apptainer/defaults/main.yml"
upstream=${version%-*}

work=$(mktemp -d "${TMPDIR:-/tmp}/podnet-apptainer.XXXXXX")
trap 'rm -rf --one-file-system "$work"' EXIT
root=$(rootfs_dir "$rootfs" "$work")
release=$(sed -n 's/^VERSION_CODENAME=//p' "$root/etc/os-release" | tr -d '"')
major=$(sed -n 's/^VERSION_ID=//p' "$root/etc/os-release" | tr -d '"')
if [ -z "$release" ] || [ -z "$major" ]; then
    die "$rootfs: no VERSION_CODENAME/VERSION_ID in /etc/os-release"
fi
pkgversion=$version+podnet1~deb$major
out=$artifacts/apptainer_${pkgversion}_amd64.deb

# the Debian source package (sid's Release may be past Valid-Until between archive updates)
mkdir -p "$work/src"
srcline="deb-src [check-valid-until=no] http://deb.debian.org/debian sid main"
{ apt_private "$work/apt-src" "$srcline" update && (cd "$work/src" && apt_private "$work/apt-src" "$srcline" \
    source --download-only "apptainer=$version"); } >"$work/apt-src.log" 2>&1 \
    || { cat "$work/apt-src.log" >&2; die "apptainer $version: no such source package in sid"; }
# the release's libseccomp-dev (libseccomp2 of the same version is in every Debian rootfs) and
# pkg-config (libseccomp-golang's cgo flags), installed in the build's throw-away overlay
mkdir -p "$work/debs"
debline="deb http://deb.debian.org/debian $release main"
seccomp=$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Version}' libseccomp2 2>/dev/null) \
    || die "$rootfs: libseccomp2 is not installed"
{ apt_private "$work/apt-deb" "$debline" update && (cd "$work/debs" && apt_private "$work/apt-deb" "$debline" \
    download "libseccomp-dev=$seccomp" pkg-config pkgconf pkgconf-bin libpkgconf3); } >"$work/apt-deb.log" 2>&1 \
    || { cat "$work/apt-deb.log" >&2; die "libseccomp-dev $seccomp: not in $release"; }

echo "apptainer ($release): rootfs and Debian packages ready after $((SECONDS - t0)) s"
inputs=$( { cat "$work/src/apptainer_$version.dsc"; sha256sum "$work"/debs/*.deb | cut -d' ' -f1
            rootfs_id "$rootfs"; go version; cat "${BASH_SOURCE[0]}" "$here/lib.sh"; } | sha256sum | cut -c1-16)
exec 9>"$artifacts/.apptainer-deb.lock"
flock 9
if [ -s "$out" ] && [ -s "$out.sha256" ] && [ "$(cat "$out.inputs" 2>/dev/null)" = "$inputs" ]; then
    echo "apptainer ($release): cached $(basename "$out") (inputs $inputs)"
    exit 0
fi
echo "apptainer ($release): building $pkgversion from Debian's source $version in $rootfs (inputs $inputs)"
b=$work/build
# Go's build cache: kept between builds (content-keyed; a rebuild after a change here relinks)
gocache=$cache/apptainer-gocache-$release
mkdir -p "$b/pkg" "$gocache"
tar -C "$b" -xzf "$work/src/apptainer_$upstream.orig.tar.gz"
mv "$b/apptainer-$upstream" "$b/src"
tar -C "$b/src" -xJf "$work/src/apptainer_$version.debian.tar.xz"
(cd "$b/src" && patch -s -p1 <debian/patches/cni_plugin_path.patch)
echo "$upstream" >"$b/src/VERSION"
echo "apptainer ($release): sources ready after $((SECONDS - t0)) s"
epoch=$(date -d "$(sed -n 's/^ -- .*>  //p' "$b/src/debian/changelog" | head -n 1)" +%s)
cp "$work"/debs/*.deb "$b/"
# the Go dependencies: upstream's go.mod and go.sum, from the Go module proxy (host side)
(cd "$b/src" && go mod download) || die "go mod download failed"
echo "apptainer ($release): Go modules ready after $((SECONDS - t0)) s"

cat >"$b/build.sh" <<EOF
set -eu
dpkg -i /podnet-build/*.deb >/dev/null
echo "build: \$(date +%T) configure"
cd /podnet-build/src
./mconfig -b builddir -V $upstream --reproducible --prefix=/usr --sysconfdir=/etc \
    --libexecdir=/usr/lib/x86_64-linux-gnu --localstatedir=/var/lib \
    --without-network --without-suid --without-libsubid
echo "build: \$(date +%T) make"
make -C builddir
echo "build: \$(date +%T) install"
make -C builddir install DESTDIR=/podnet-build/pkg
# as dh_strip does (the release's binutils)
find /podnet-build/pkg -type f -exec sh -c 'head -c4 "\$1" | grep -q ELF && strip --strip-unneeded --remove-section=.comment "\$1"' _ {} \;
# the newest glibc symbol version any ELF file needs: the Depends on libc6
find /podnet-build/pkg -type f -exec sh -c 'head -c4 "\$1" | grep -q ELF && objdump -T "\$1"' _ {} \; \
    | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n 1 >/podnet-build/glibc
EOF
systemd-nspawn --quiet --register=no --keep-unit --private-network --volatile=overlay \
    --machine="pnapptainer-$$" -D "$root" --bind="$b:/podnet-build" --bind="$gocache:/podnet-gocache" \
    --bind-ro=/usr/local/go:/usr/local/go --bind-ro="$GOMODCACHE:/podnet-gomod" \
    --setenv=LC_ALL=C.UTF-8 --setenv=HOME=/tmp --setenv=PATH=/usr/local/go/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --setenv=GOMODCACHE=/podnet-gomod --setenv=GOCACHE=/podnet-gocache --setenv=GOPROXY=off \
    --setenv=GOTOOLCHAIN=local --setenv=GOFLAGS=-mod=readonly --setenv=SOURCE_DATE_EPOCH="$epoch" \
    sh /podnet-build/build.sh >"$work/make.log" 2>&1 || {
    tail -n 60 "$work/make.log" >&2
    cp "$work/make.log" "${TMPDIR:-/tmp}/podnet-apptainer-make.log" || true
    die "build failed in $rootfs ($release)"
}
grep '^build: ' "$work/make.log"
glibc=$(cat "$b/glibc")
[ -n "$glibc" ] || die "no GLIBC_ symbol versions found in the build"

# the package: sid's layout (debian/rules' install step) and control data
p=$b/pkg
if [ ! -x "$p/usr/bin/apptainer" ] || [ ! -x "$p/usr/lib/x86_64-linux-gnu/apptainer/bin/starter" ]; then
    die "make install did not install apptainer and its starter"
fi
rm -f "$p/usr/bin/singularity"
ln -s apptainer "$p/usr/bin/singularity.apptainer"
[ -e "$p/usr/bin/run-singularity" ] && mv "$p/usr/bin/run-singularity" "$p/usr/bin/run-singularity.apptainer"
if [ -d "$p/etc/bash_completion.d" ]; then
    mkdir -p "$p/usr/share/bash-completion"
    mv "$p/etc/bash_completion.d" "$p/usr/share/bash-completion/completions"
fi
for f in "$p"/usr/share/bash-completion/completions/*singularity*; do
    [ -e "$f" ] && [ ! -L "$f" ] && mv "$f" "$f.apptainer"
done
rm -f "$p"/usr/share/bash-completion/completions/singularity
# Debian's CNI network examples (debian/apptainer.install), which --without-network leaves out
mkdir -p "$p/etc/apptainer/network"
cp "$b"/src/etc/network/* "$p/etc/apptainer/network/"
# man pages: compressed, apptainer's only (the singularity-* copies are the same pages)
rm -f "$p"/usr/share/man/man1/singularity*.1
find "$p/usr/share/man" -type f -name '*.1' -exec gzip -n -9 {} +
mkdir -p "$p/usr/share/doc/apptainer" "$p/var/lib/apptainer/mnt/session" "$p/var/lib/apptainer/mnt/source" "$p/DEBIAN"
cp "$b/src/debian/copyright" "$p/usr/share/doc/apptainer/copyright"
cat >"$p/usr/share/doc/apptainer/README.podnet" <<EOF
Apptainer $upstream built by podnet (agent/artifacts/build-apptainer-deb.sh) for Debian $major
($release) from Debian's source package apptainer $version (sid), configured as Debian's:
--without-suid --without-network, CNI plugins from /usr/lib/cni.
EOF
(cd "$p" && find etc -type f | LC_ALL=C sort | sed 's|^|/|') >"$p/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$p" | cut -f1)
cat >"$p/DEBIAN/control" <<EOF
Package: apptainer
Version: $pkgversion
Architecture: amd64
Maintainer: podnet <podnet@localhost>
Installed-Size: $size
Depends: ca-certificates, containernetworking-plugins, squashfs-tools, uidmap, libc6 (>= $glibc), libseccomp2 (>= 2.5.0)
Recommends: e2fsprogs
Provides: singularity-container
Section: admin
Priority: optional
Homepage: https://apptainer.org/
Description: container platform focused on supporting "Mobility of Compute"
 Apptainer $upstream, Debian's source package $version built for Debian $major ($release)
 by podnet (build-apptainer-deb.sh): Debian sid's build needs glibc 2.38.
EOF
cat >"$p/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = "configure" ] || [ "$1" = "abort-upgrade" ] || [ "$1" = "abort-deconfigure" ] || [ "$1" = "abort-remove" ]; then
    update-alternatives --install /usr/bin/singularity singularity /usr/bin/singularity.apptainer 50 \
        --slave /usr/bin/run-singularity run-singularity /usr/bin/run-singularity.apptainer \
        --slave /usr/share/bash-completion/completions/singularity singularity-bash-completion /usr/share/bash-completion/completions/singularity.apptainer
fi
EOF
cat >"$p/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = "remove" ]; then
    update-alternatives --remove singularity /usr/bin/singularity.apptainer
fi
EOF
chmod 0755 "$p/DEBIAN/postinst" "$p/DEBIAN/prerm"
(cd "$p" && find . -path ./DEBIAN -prune -o -type f -print | LC_ALL=C sort | sed 's|^\./||' \
    | xargs -r -d '\n' md5sum >DEBIAN/md5sums)
chmod -R u+rwX,go+rX,go-w "$p"
find "$p" -exec touch -h -d "@$epoch" {} +
tmp=$(mktemp "$artifacts/.apptainer-deb.XXXXXX")
SOURCE_DATE_EPOCH=$epoch dpkg-deb --root-owner-group -Zxz --build "$p" "$tmp" >/dev/null
chmod 0644 "$tmp"
mv -f "$tmp" "$out"
(cd "$artifacts" && sha256sum "$(basename "$out")" >"$out.sha256.tmp" && mv -f "$out.sha256.tmp" "$out.sha256")
echo "$inputs" >"$out.inputs"
echo "apptainer ($release): built $(basename "$out") in $((SECONDS - t0)) s, $(du -h "$out" | cut -f1), needs glibc >= $glibc"
echo "apptainer ($release): sha256 $(cut -d' ' -f1 "$out.sha256")"
