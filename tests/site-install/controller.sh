#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A clean controller, the way a site sets one up (docs/install.md "The controller"): a fresh
# venv with ansible-core only, an empty collections path, community.crypto from a collection
# tarball (Galaxy is unreachable here: the tarball is made once from PyPI's `ansible` package,
# which bundles it), then the release's collection tarball. Nothing of the checkout is used:
#
#   tests/site-install/controller.sh ANSIBLE_CORE_VERSION DIR COLLECTION_TARBALL
#
# DIR/venv, DIR/collections; prints the `pip freeze` and the collection list. Run playbooks
# with: env -i PATH=DIR/venv/bin:/usr/bin:/bin HOME=$HOME ANSIBLE_COLLECTIONS_PATH=DIR/collections ...
# The venv and the community.crypto tarball are cached in $PODNET_CACHE_DIR/controller
# (keyed by the versions); the collections path is made anew every time.
set -euo pipefail
core=${1:?usage: controller.sh ANSIBLE_CORE_VERSION DIR COLLECTION_TARBALL}
dir=${2:?usage: controller.sh ANSIBLE_CORE_VERSION DIR COLLECTION_TARBALL}
tarball=${3:?usage: controller.sh ANSIBLE_CORE_VERSION DIR COLLECTION_TARBALL}
cache=${PODNET_CACHE_DIR:-/var/cache/podnet-dev}/controller
py=${PYTHON:-/usr/bin/python3}
die() { echo "controller: $*" >&2; exit 1; }
ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ -f "$tarball" ] || die "$tarball: no such collection tarball"
mkdir -p "$cache" "$dir"

# community.crypto as a collection tarball (the release has it too: agent/artifacts/build-crypto-tarball.sh)
crypto=$("$ROOT_DIR/agent/artifacts/build-crypto-tarball.sh")
[ -f "$crypto" ] || die "no community.crypto tarball"

venv=$cache/venv-ansible-core-$core
if [ ! -x "$venv/bin/ansible-playbook" ]; then
    (
        flock 9
        [ -x "$venv/bin/ansible-playbook" ] && exit 0
        rm -rf "$venv.tmp"
        "$py" -m venv "$venv.tmp"
        "$venv.tmp/bin/pip" install -q "ansible-core==$core"
        rm -rf "$venv" && mv "$venv.tmp" "$venv"
        grep -rlI --null "$venv.tmp" "$venv/bin" | xargs -0 -r sed -i "s#$venv.tmp#$venv#g"
    ) 9>"$cache/.venv-$core.lock"
fi
ln -sfn "$venv" "$dir/venv"
rm -rf "$dir/collections"
mkdir -p "$dir/collections"
clean=(env -i PATH="$venv/bin:/usr/bin:/bin" HOME="${HOME:-/root}" LANG=C.UTF-8
       ANSIBLE_COLLECTIONS_PATH="$dir/collections")
# --offline: dependencies from the tarballs given, no Galaxy
"${clean[@]}" ansible-galaxy collection install --offline -p "$dir/collections" "$crypto" "$tarball" >/dev/null
echo "controller: $dir (ansible-core $core)"
"${clean[@]}" pip freeze --all
"${clean[@]}" ansible-galaxy collection list -p "$dir/collections" 2>/dev/null | grep -E '^(community|hpc)\.'
