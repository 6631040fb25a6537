#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The artifact bundle of a release (make release; docs/install.md): one directory with every
# file the roles install on nodes that a stock Debian mirror does not have, and SHA256SUMS (the
# index hpc.podnet._common checks each file against; podnet_artifact_dir points here):
#
#   bundle.sh OUT [--native DIR]...
#
#   coredns-<v>-linux-amd64, flanneld-<v>-linux-amd64, flannel-cni-<v>-linux-amd64,
#   apptainer_<v>_amd64.deb, containernetworking-plugins_<v>_amd64.deb,
#   etcd-v<v>-linux-amd64.tar.gz (the etcd role's artifact method: Debian 12 members),
#   podnet-kube-<v>-linux-amd64 (the hpk role: HPK's control plane, docs/hpk.md)
#       from $PODNET_CACHE_DIR/artifacts (agent/artifacts/build-artifacts.sh), named by the
#       roles' defaults (coredns_artifact_name, ...: what the roles look for)
#   apptainer_<v>+podnet1~deb12_amd64.deb (apptainer_bookworm_artifact_name: Debian 12 nodes)
#       when it was built (agent/artifacts/build-apptainer-deb.sh: make release, the site lane)
#   podnet-debs-bookworm.tar, podnet-debs-trixie.tar (air-gapped nodes: the stock Debian
#       packages the roles install, podnet_package_source: bundle) when they were built
#       (agent/artifacts/build-debian-packages.sh: make release, the site lane)
#   prometheus-<v>.linux-amd64.tar.gz (hpc.podnet.prometheus's artifact method) when it was
#       built (make artifacts)
#   podnet-wheelhouse-<version>/      from $PODNET_WHEELHOUSE_DIR (default: the same artifacts
#       directory; build-wheelhouse.sh)
#   podnet-native-<version>-<platform>/   the native builds DIR (default: every one of this
#       version in $PODNET_WHEELHOUSE_DIR; agent/native/build-artifact.sh, one per platform)
#
# Nothing else: no cnitool (no role installs it), no builder's bookkeeping (.inputs, .sha256,
# dot files). Real copies (the bundle is what a site copies away). SHA256SUMS: `<sha256>  <path>`
# relative to OUT, sorted by path (C locale).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
roles=$here/../../roles
usage="usage: bundle.sh OUT [--native DIR]..."
out=${1:?$usage}
shift
natives=()
while [ $# -gt 0 ]; do
    if [ "$1" != --native ] || [ -z "${2:-}" ]; then echo "$usage" >&2; exit 2; fi
    natives+=("$(cd "$2" && pwd)")
    shift 2
done
cache=${PODNET_CACHE_DIR:-/var/cache/podnet-dev}/artifacts
built=${PODNET_WHEELHOUSE_DIR:-$cache}
die() { echo "bundle: $*" >&2; exit 1; }

# shellcheck source=agent/artifacts/role_default.sh
. "$here/role_default.sh"
version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$here/../pyproject.toml" | head -n 1)
[ -n "$version" ] || die "no version in agent/pyproject.toml"
files=(
    "$(role_default coredns coredns_artifact_name)"
    "$(role_default flannel flannel_artifact_name)"
    "$(role_default flannel flannel_cni_artifact_name)"
    "$(role_default flannel flannel_cni_plugins_artifact_name)"
    "$(role_default apptainer apptainer_artifact_name)"
    "$(role_default etcd etcd_artifact_name)"
    "$(role_default hpk hpk_kube_artifact_name)"
)
# built on demand, not by make artifacts: in the bundle when built (with its .sha256)
for f in "$(role_default apptainer apptainer_bookworm_artifact_name)" podnet-debs-bookworm.tar podnet-debs-trixie.tar \
         "$(role_default prometheus prometheus_artifact_name)"; do
    if [ -s "$cache/$f" ] && [ -s "$cache/$f.sha256" ]; then
        (cd "$cache" && sha256sum --quiet -c "$f.sha256") || die "$cache/$f: does not match its .sha256"
        files+=("$f")
    fi
done
for f in "${files[@]}"; do
    [ -s "$cache/$f" ] || die "$cache/$f missing: run agent/artifacts/build-artifacts.sh (make artifacts)"
done
wheelhouse=$built/podnet-wheelhouse-$version
[ -s "$wheelhouse/SHA256SUMS" ] \
    || die "$wheelhouse missing: run agent/artifacts/build-wheelhouse.sh (make artifacts)"
if [ "${#natives[@]}" = 0 ]; then
    mapfile -t natives < <(find "$built" -mindepth 1 -maxdepth 1 -type d -name "podnet-native-$version-*" | LC_ALL=C sort)
fi
[ "${#natives[@]}" -gt 0 ] || die "no $built/podnet-native-$version-*: run agent/native/build-artifact.sh (make artifacts)"
for d in "${natives[@]}"; do
    if [[ $(basename "$d") != podnet-native-$version-* ]] || [ ! -s "$d/SHA256SUMS" ]; then
        die "$d: not a native build of podnet $version (agent/native/build-artifact.sh)"
    fi
    # the build's own index must hold: a damaged build never goes into a bundle
    (cd "$d" && sha256sum --quiet -c SHA256SUMS) || die "$d: its files do not match its SHA256SUMS"
done
(cd "$wheelhouse" && sha256sum --quiet -c SHA256SUMS) || die "$wheelhouse: its files do not match its SHA256SUMS"

rm -rf "$out"
mkdir -p "$out"
for f in "${files[@]}"; do cp -L "$cache/$f" "$out/$f"; done
for d in "$wheelhouse" "${natives[@]}"; do
    mkdir "$out/$(basename "$d")"
    find "$d" -maxdepth 1 -type f ! -name '.*' -exec cp -t "$out/$(basename "$d")" {} +
done
chmod -R u+rwX,go+rX,go-w "$out"
(cd "$out" && find . -type f ! -path ./SHA256SUMS ! -name '.*' -printf '%P\n' | LC_ALL=C sort \
    | xargs -r -d '\n' sha256sum >.SHA256SUMS.tmp && mv -f .SHA256SUMS.tmp SHA256SUMS)
echo "bundle: $out ($(wc -l <"$out/SHA256SUMS") files, $(du -sh "$out" | cut -f1))"
