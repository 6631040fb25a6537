#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The podnet agent and its dependencies as wheels for every Python of the supported node
# platforms (Debian 12: CPython 3.11, Debian 13: CPython 3.13; x86_64; pip on the node
# picks the wheels of its own Python), into $PODNET_WHEELHOUSE_DIR/podnet-wheelhouse-<version>/
# (default $PODNET_CACHE_DIR/artifacts; the Makefile sets it to this checkout's
# build/artifacts: built from this checkout's sources, never from another checkout's that
# shares the cache): the directory hpc.podnet.agent installs from with `pip --no-index`
# (nodes have no internet). Shipped in the collection (agent/artifacts/): a site runs it from
# the installed collection on a connected machine (docs/admin-guide.md "Artifacts").
#   PYTHON   the Python >= 3.11 with pip (and setuptools) that builds (default: the
#            checkout's .venv, else python3)
# The dependencies are pinned in agent/requirements.txt (the versions the tests run with).
# Skipped when the directory exists and was built from the same inputs.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${PODNET_CACHE_DIR:-/var/cache/podnet-dev}
py=${PYTHON:-}
if [ -z "$py" ]; then
    if [ -x "$root/.venv/bin/python" ]; then py=$root/.venv/bin/python; else py=$(command -v python3); fi
fi
node_pys=${NODE_PYTHON_VERSIONS:-3.11 3.13}
version=$("$py" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' \
    "$root/agent/pyproject.toml")
out=${PODNET_WHEELHOUSE_DIR:-$cache/artifacts}/podnet-wheelhouse-$version
deps=$cache/artifacts/wheel-deps  # the dependencies' wheels, shared by every checkout
# pinned runtime dependencies (the versions the tests run with: agent/requirements.txt)
pins=$(grep -E '^(pyroute2|prometheus-client|PyYAML|grpcio|protobuf)==' "$root/agent/requirements.txt" || true)
# the sources only (never agent/build or other build leftovers): the same sources give the
# same inputs, and (SOURCE_DATE_EPOCH, built from a clean copy) the same wheel bytes, in any
# checkout, so the agent role never reinstalls an unchanged podnet
export SOURCE_DATE_EPOCH=315532800
inputs=$( { (cd "$root/agent" && find pyproject.toml src -type f \( -name '*.py' -o -name '*.toml' \) \
              -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 cat);
            echo "$pins $node_pys"; cat "${BASH_SOURCE[0]}"; } | sha256sum | cut -c1-16)
mkdir -p "$cache/artifacts" "$(dirname "$out")" "$deps"
if [ -f "$out/.inputs" ] && [ "$(cat "$out/.inputs")" = "$inputs" ]; then
    echo "wheelhouse: cached $out (inputs $inputs)"
    exit 0
fi
tmp=$(mktemp -d "$(dirname "$out")/.wheelhouse.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/src"
(cd "$root/agent" && tar --exclude=__pycache__ --exclude='*.egg-info' -cf - pyproject.toml src) \
    | tar -C "$tmp/src" -xf -
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$tmp" "$tmp/src"
rm -rf "$tmp/src"
reqs=$tmp/requirements.txt
{
    echo "$pins"
    # what pyproject.toml asks for, for anything not pinned above
    "$py" -c 'import tomllib,sys; print("\n".join(tomllib.load(open(sys.argv[1],"rb"))["project"]["dependencies"]))' \
        "$root/agent/pyproject.toml" | grep -viE '^(pyroute2|prometheus-client|grpcio|protobuf)[<>=!~ ]' || true
} | sed '/^$/d' >"$reqs"
download() {
    local node_py=$1
    shift
    "$py" -m pip download -q -d "$tmp" --only-binary=:all: --python-version "$node_py" \
        --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_28_x86_64 --platform any -r "$reqs" "$@"
}
# the dependencies rarely change: reuse the previous wheelhouse offline, else download
for node_py in $node_pys; do
    if ! download "$node_py" --no-index --find-links "$deps" 2>/dev/null; then
        download "$node_py"
    fi
done
find "$tmp" -maxdepth 1 -name '*.whl' ! -name 'podnet-*' -exec cp -n {} "$deps/" \;
rm -f "$reqs"
echo "$inputs" >"$tmp/.inputs"
(cd "$tmp" && sha256sum ./*.whl >SHA256SUMS)
chmod 0755 "$tmp"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "wheelhouse: built $out ($(find "$out" -name '*.whl' | wc -l) wheels)"
