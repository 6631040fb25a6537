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
# the ansible package whose community.crypto a site would take from Galaxy (3.x)
ansible_pkg=${PODNET_CRYPTO_FROM:-ansible==12.3.0}
py=${PYTHON:-/usr/bin/python3}
die() { echo "controller: $*" >&2; exit 1; }
[ -f "$tarball" ] || die "$tarball: no such collection tarball"
mkdir -p "$cache" "$dir"

# community.crypto as a collection tarball (MANIFEST.json and FILES.json as published)
crypto=$(find "$cache" -maxdepth 1 -name 'community-crypto-*.tar.gz' | sort | tail -n 1)
if [ -z "$crypto" ]; then
    (
        flock 9
        tmp=$(mktemp -d "$cache/.crypto.XXXXXX")
        trap 'rm -rf "$tmp"' EXIT
        "$py" -m pip download -q --no-deps -d "$tmp" "$ansible_pkg"
        wheel=$(find "$tmp" -name 'ansible-*.whl' | head -n 1)
        [ -n "$wheel" ] || die "no wheel of $ansible_pkg"
        # the collection's files out of the wheel, as a collection tarball (names without "./")
        "$py" - "$wheel" "$cache" <<'PY'
import hashlib, io, json, os, sys, tarfile, zipfile
# The ansible package leaves out some of the collection's files (CI configuration): its
# FILES.json, which ansible-galaxy checks on install, keeps the entries of what is there, and
# MANIFEST.json the new FILES.json's sha256. Every file is the published one.
pre = "ansible_collections/community/crypto/"
with zipfile.ZipFile(sys.argv[1]) as z:
    names = sorted(n for n in z.namelist() if n.startswith(pre) and not n.endswith("/") and "__pycache__" not in n)
    data = {n[len(pre):]: z.read(n) for n in names}
files = json.loads(data["FILES.json"])
dirs = {os.path.dirname(n) for n in data} | {"."}
dirs |= {os.path.dirname(d) for d in list(dirs)}
files["files"] = [f for f in files["files"] if f["name"] in data or (f["ftype"] == "dir" and f["name"] in dirs)]
data["FILES.json"] = json.dumps(files, indent=True).encode()
manifest = json.loads(data["MANIFEST.json"])
manifest["file_manifest_file"]["chksum_sha256"] = hashlib.sha256(data["FILES.json"]).hexdigest()
data["MANIFEST.json"] = json.dumps(manifest, indent=True).encode()
version = manifest["collection_info"]["version"]
out = f"{sys.argv[2]}/community-crypto-{version}.tar.gz"
with tarfile.open(out + ".tmp", "w:gz") as t:
    for n in ["MANIFEST.json", "FILES.json"]:
        info = tarfile.TarInfo(n)
        info.size, info.mode = len(data[n]), 0o644
        t.addfile(info, io.BytesIO(data[n]))
    for f in files["files"]:
        if f["name"] == ".":
            continue
        info = tarfile.TarInfo(f["name"])
        if f["ftype"] == "dir":
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            t.addfile(info)
        else:
            info.size, info.mode = len(data[f["name"]]), 0o644
            t.addfile(info, io.BytesIO(data[f["name"]]))
os.replace(out + ".tmp", out)
PY
    ) 9>"$cache/.crypto.lock"
    crypto=$(find "$cache" -maxdepth 1 -name 'community-crypto-*.tar.gz' | sort | tail -n 1)
fi

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
