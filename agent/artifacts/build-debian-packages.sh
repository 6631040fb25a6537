#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Debian packages podnet's roles install on a node of one Debian release, as one archive for
# nodes without any apt source (podnet_package_source: bundle; docs/install.md "Air-gapped
# nodes"):
#
#   build-debian-packages.sh RELEASE        (bookworm or trixie)
#
# Writes $PODNET_CACHE_DIR/artifacts/podnet-debs-RELEASE.tar (+ .sha256): a flat apt repository
# (the .debs, their Packages index and a Release of its checksums, unsigned: the bundle's
# SHA256SUMS covers the archive) that hpc.podnet._common unpacks on the node and adds as
# its apt source. What is in it: the packages the roles name (agent_packages, gateway_packages,
# etcd_packages, the slurm_packages_* of a managed Slurm, python3-apt for Ansible's apt
# module), the dependencies of the bundle's Apptainer .deb for that release and the CNI plugins
# as the release has them (Apptainer needs them before the flannel role installs the bundle's),
# each with its whole dependency closure as apt resolves it on an empty system
# (Depends and Pre-Depends, no Recommends): a node with any older point release of RELEASE
# finds every package it lacks. Not in it: the build tools of *_build_on_node (gcc, ...).
#
# From RELEASE's main suite on PODNET_DEBIAN_MIRROR (default http://deb.debian.org/debian), by an
# apt of its own (sources, lists, cache under a temporary directory; signatures checked against
# the host's Debian keyring); the host's apt state is not touched. Reproducible for one state of
# the mirror: Debian's own .debs, an index written in name order, a tar with fixed owners and
# times. Skipped when the archive exists and was made from the same inputs (.inputs beside it:
# this script, the package list, the mirror's Release file of RELEASE, the local .debs).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=agent/artifacts/lib.sh
. "$here/lib.sh"
roles=$here/../../roles
release=${1:?usage: build-debian-packages.sh RELEASE (bookworm or trixie)}
[[ $release =~ ^(bookworm|trixie)$ ]] || { echo "build-debian-packages: RELEASE must be bookworm or trixie" >&2; exit 2; }
mirror=${PODNET_DEBIAN_MIRROR:-http://deb.debian.org/debian}
artifacts=${PODNET_CACHE_DIR:-/var/cache/podnet-dev}/artifacts
out=$artifacts/podnet-debs-$release.tar
die() { echo "build-debian-packages: $*" >&2; exit 1; }
t0=$SECONDS
mkdir -p "$artifacts"

# the package names of the roles' defaults (one list per variable; YAML lists)
mapfile -t named < <(python3 - "$roles" <<'PY'
import sys
from pathlib import Path

import yaml

roles = Path(sys.argv[1])
wanted = {
    "agent": ["agent_packages"],
    "gateway": ["gateway_packages"],
    "etcd": ["etcd_packages"],
    "slurm": ["slurm_packages_common", "slurm_packages_controller", "slurm_packages_compute"],
}
names = {"python3-apt"}  # Ansible's apt module needs it on the node
for role, variables in wanted.items():
    defaults = yaml.safe_load((roles / role / "defaults" / "main.yml").read_text())
    for var in variables:
        value = defaults.get(var)
        if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
            sys.exit(f"roles/{role}/defaults/main.yml: {var} is not a list of package names")
        names.update(value)
print("\n".join(sorted(names)))
PY
) || die "cannot read the package lists of the roles' defaults (python3 with PyYAML: make deps)"
# the bundle's own .debs for this release, whose dependencies come from the archive
# shellcheck source=agent/artifacts/role_default.sh
. "$here/role_default.sh"
if [ "$release" = bookworm ]; then app=$(role_default apptainer apptainer_bookworm_artifact_name)
else app=$(role_default apptainer apptainer_artifact_name); fi
cni=$artifacts/$(role_default flannel flannel_cni_plugins_artifact_name)
# apt resolves the Apptainer .deb's dependencies from the archive; the CNI .deb is only
# checked to exist and hashed into the inputs (its package, as RELEASE has it, is named below)
local_debs=("$artifacts/$app" "$cni")
for d in "${local_debs[@]}"; do
    [ -s "$d" ] || die "$d missing: make artifacts (bookworm's Apptainer: agent/artifacts/build-apptainer-deb.sh)"
done
# the CNI plugins as RELEASE has them too: Apptainer depends on them, and its role runs before
# the flannel role installs the bundle's .deb (or without it: podnet_flannel_enabled false)
named+=("$(dpkg-deb -f "$cni" Package)")

work=$(mktemp -d "${TMPDIR:-/tmp}/podnet-debs.XXXXXX")
trap 'rm -rf --one-file-system "$work"' EXIT
mkdir -p "$work/repo"
: >"$work/status"
# an empty dpkg status: apt resolves every package as if none were installed (the closure)
apt=(apt_private "$work" "deb $mirror $release main" -y -o "Dir::State::status=$work/status"
     -o "APT::Architectures::=amd64" -o "APT::Install-Recommends=false" -o "APT::Install-Suggests=false")
"${apt[@]}" update >"$work/update.log" 2>&1 || { cat "$work/update.log" >&2; die "apt update of $mirror $release failed"; }

inputs=$( {
    cat "${BASH_SOURCE[0]}" "$here/lib.sh"
    printf '%s\n' "$mirror" "${named[@]}"
    cat "$work"/lists/*_Release 2>/dev/null || cat "$work"/lists/*_InRelease
    sha256sum "${local_debs[@]}" | cut -d' ' -f1
} | sha256sum | cut -d' ' -f1)
if [ -s "$out" ] && [ -s "$out.sha256" ] && [ "$(cat "$out.inputs" 2>/dev/null)" = "$inputs" ]; then
    echo "debian packages ($release): cached $out ($(du -h "$out" | cut -f1))"
    exit 0
fi

"${apt[@]}" install --download-only "${named[@]}" "$artifacts/$app" >"$work/install.log" 2>&1 \
    || { tail -n 30 "$work/install.log" >&2; die "the packages cannot be resolved in $release"; }
find "$work/cache/archives" -maxdepth 1 -name '*.deb' -exec mv -t "$work/repo" {} +
n=$(find "$work/repo" -name '*.deb' | wc -l)
[ "$n" -gt 0 ] || die "apt downloaded nothing"
# the index: each package's control stanza, where it is and its checksums (what apt-ftparchive
# writes; dpkg-deb and sha256sum only, in file name order)
(
    cd "$work/repo"
    for d in $(find . -maxdepth 1 -name '*.deb' -printf '%P\n' | LC_ALL=C sort); do
        dpkg-deb -f "$d"
        printf 'Filename: ./%s\nSize: %s\nMD5sum: %s\nSHA256: %s\n\n' "$d" "$(stat -c %s "$d")" \
            "$(md5sum "$d" | cut -d' ' -f1)" "$(sha256sum "$d" | cut -d' ' -f1)"
    done
) >"$work/repo/Packages"
gzip -9 -n -k "$work/repo/Packages"
# a Release naming the indexes' checksums (apt then asks for no other compression), dated like
# the mirror's Release it was resolved from
date=$(sed -n 's/^Date: //p' "$work"/lists/*Release | head -n 1)
{
    printf 'Origin: podnet\nLabel: podnet\nCodename: %s\nDate: %s\nArchitectures: amd64 all\nSHA256:\n' "$release" "$date"
    for f in Packages Packages.gz; do
        printf ' %s %s %s\n' "$(sha256sum "$work/repo/$f" | cut -d' ' -f1)" "$(stat -c %s "$work/repo/$f")" "$f"
    done
} >"$work/repo/Release"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu --mode=u+rw,go+r,go-w \
    -C "$work/repo" -cf "$out.tmp" .
mv -f "$out.tmp" "$out"
(cd "$artifacts" && sha256sum "$(basename "$out")" >"$out.sha256.tmp" && mv -f "$out.sha256.tmp" "$out.sha256")
echo "$inputs" >"$out.inputs"
echo "debian packages ($release): $out, $n packages, $(du -h "$out" | cut -f1), in $((SECONDS - t0)) s"
