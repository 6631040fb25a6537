#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The next release of the tree under test, for the site install's upgrade (upgrade.sh): the same
# sources with the version bumped (0.2.0 -> 0.2.1), built the way make release builds:
#
#   tests/site-install/build-next.sh OUT ROOTFS
#
#   OUT/tree/                 a copy of the checkout's tracked files (as they are in the work tree;
#                             the checkout itself is never modified), its version set by
#                             tests/release/set-version.sh
#   OUT/dist/                 tests/release/release.sh of that copy: hpc-podnet-<next>.tar.gz,
#                             artifacts/ (the bundle, with SHA256SUMS), SHA256SUMS
#   OUT/VERSION               the next version
# ROOTFS: the nodes' image (tests/lab/lab.sh image): the native build for their platform, the
# only one in the bundle. The wheelhouse and native build go to OUT/../next-artifacts, kept
# between runs (their builders skip what was built from the same inputs); CoreDNS, Flannel, etcd
# are the cached ones of make artifacts ($PODNET_CACHE_DIR/artifacts), as in any release.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: build-next.sh OUT ROOTFS}
rootfs=${2:?usage: build-next.sh OUT ROOTFS}
t0=$SECONDS
version=$(sed -n 's/^version: *//p' "$ROOT/galaxy.yml")
IFS=. read -r major minor patch <<<"$version"
next=$major.$minor.$((patch + 1))
built=$(dirname "$out")/next-artifacts

rm -rf "$out"
mkdir -p "$out/tree" "$built"
# the tracked files as they are now (work tree), without the ones deleted in it
(cd "$ROOT" && git ls-files -z --cached | while IFS= read -r -d '' f; do
    [ -e "$f" ] || [ -L "$f" ] && printf '%s\0' "$f"; done | tar --null -T - -cf -) | tar -C "$out/tree" -xf -
"$out/tree/tests/release/set-version.sh" "$next" "$out/tree" >/dev/null
echo "$next" >"$out/VERSION"

export PODNET_WHEELHOUSE_DIR=$built
if [ -z "${PYTHON:-}" ] && [ -x "$ROOT/.venv/bin/python" ]; then export PYTHON=$ROOT/.venv/bin/python; fi
"$out/tree/agent/artifacts/build-wheelhouse.sh"
"$out/tree/agent/native/build-artifact.sh" "$rootfs" "$built"
# only this version's builds go into the bundle (release.sh -> bundle.sh: podnet-native-<next>-*)
SOURCE_DATE_EPOCH=$(git -C "$ROOT" log -1 --format=%ct) "$out/tree/tests/release/release.sh" "$out/dist"
echo "build-next: podnet $next in $out/dist ($((SECONDS - t0)) s)"
