#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# make release: what a site installs, built on this machine from the artifacts `make artifacts`
# built (no lab; only community.crypto's package from PyPI, once, cached):
#
#   tests/release/release.sh OUT        (the Makefile: dist/podnet-<version>)
#
#   OUT/hpc-podnet-<version>.tar.gz   the collection (ansible-galaxy collection build; its
#                                     members dated SOURCE_DATE_EPOCH, gzip without a time:
#                                     the same tree gives the same bytes)
#   OUT/community-crypto-<v>.tar.gz   the collection podnet's needs (agent/artifacts/build-crypto-tarball.sh:
#                                     from PyPI's ansible package, cached; the same bytes each time)
#   OUT/artifacts/                    the artifact bundle (agent/artifacts/bundle.sh): every file
#                                     the roles install on nodes that stock Debian has not, with
#                                     its SHA256SUMS (podnet_artifact_dir=OUT/artifacts)
#   OUT/SHA256SUMS                    over all of it (`cd OUT && sha256sum -c SHA256SUMS`)
#
# One version everywhere it is named (galaxy.yml, the agent, the roles' defaults), or it stops.
# SOURCE_DATE_EPOCH: default the time of the checkout's last commit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: tests/release/release.sh OUT}
export PODNET_WHEELHOUSE_DIR=${PODNET_WHEELHOUSE_DIR:-$ROOT/build/artifacts}
die() { echo "release: $*" >&2; exit 1; }
t0=$SECONDS

version=$(sed -n 's/^version: *//p' "$ROOT/galaxy.yml")
[ -n "$version" ] || die "no version in galaxy.yml"
declare -A named=(
    [agent/pyproject.toml]=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$ROOT/agent/pyproject.toml")
    [agent/src/podnet/__init__.py]=$(sed -n 's/^__version__ *= *"\(.*\)"/\1/p' "$ROOT/agent/src/podnet/__init__.py")
    [agent_version]=$(sed -n 's/^agent_version: *"\(.*\)"/\1/p' "$ROOT/roles/agent/defaults/main.yml")
    [spank_native_version]=$(sed -n 's/^spank_native_version: *"\(.*\)"/\1/p' "$ROOT/roles/spank/defaults/main.yml")
    [sshd_hooks_native_version]=$(sed -n 's/^sshd_hooks_native_version: *"\(.*\)"/\1/p' "$ROOT/roles/sshd_hooks/defaults/main.yml")
)
for k in "${!named[@]}"; do
    [ "${named[$k]}" = "$version" ] || die "galaxy.yml says $version, $k says '${named[$k]}'"
done
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 315532800)
fi
export SOURCE_DATE_EPOCH
work=$(mktemp -d "${TMPDIR:-/tmp}/podnet-release.XXXXXX")
trap 'rm -rf --one-file-system "$work"' EXIT
tmp=$out.tmp
rm -rf "$tmp"
mkdir -p "$tmp"

# the collection: ansible-galaxy writes each member with its file's time; dated
# SOURCE_DATE_EPOCH and gzipped without a name or time, the same tree is the same tarball
tarball=hpc-podnet-$version.tar.gz
ansible-galaxy collection build --output-path "$work" "$ROOT" >/dev/null
python3 - "$work/$tarball" "$tmp/$tarball" "$SOURCE_DATE_EPOCH" <<'PY'
import gzip
import io
import sys
import tarfile

src, dst, epoch = sys.argv[1], sys.argv[2], int(sys.argv[3])
buf = io.BytesIO()
with tarfile.open(src) as tin, tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tout:
    for m in sorted(tin.getmembers(), key=lambda m: m.name):
        m.mtime = epoch
        m.uid = m.gid = 0
        m.uname = m.gname = ""
        tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
with open(dst, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
    gz.write(buf.getvalue())
PY

# community.crypto, which the collection needs, for a controller without Galaxy
crypto=$("$ROOT/agent/artifacts/build-crypto-tarball.sh")
cp "$crypto" "$tmp/"
"$ROOT/agent/artifacts/bundle.sh" "$tmp/artifacts"
(cd "$tmp" && find . -type f ! -path ./SHA256SUMS ! -name '.*' -printf '%P\n' | LC_ALL=C sort \
    | xargs -r -d '\n' sha256sum >"$work/SHA256SUMS" && mv "$work/SHA256SUMS" SHA256SUMS)
rm -rf "$out"
mv "$tmp" "$out"
echo "release: $out, podnet $version: $(wc -l <"$out/SHA256SUMS") files, $(du -sh "$out" | cut -f1) ($((SECONDS - t0)) s)"
