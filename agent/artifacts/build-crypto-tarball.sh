#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# community.crypto as a collection tarball, for a controller without Galaxy (docs/install.md):
# the release ships it beside podnet's collection (tests/release/release.sh), and the site lane's
# controller installs it (tests/site-install/controller.sh). Galaxy is unreachable here: the
# collection comes from PyPI's `ansible` package, which bundles it (PODNET_CRYPTO_FROM, default
# the dev venv's pin). Cached in $PODNET_CACHE_DIR/artifacts by the package it came from; prints
# the tarball's path.
#   agent/artifacts/build-crypto-tarball.sh
set -euo pipefail
ansible_pkg=${PODNET_CRYPTO_FROM:-ansible==12.3.0}
cache=${PODNET_CACHE_DIR:-/var/cache/podnet-dev}/artifacts
py=${PYTHON:-/usr/bin/python3}
die() { echo "build-crypto-tarball: $*" >&2; exit 1; }
mkdir -p "$cache"
stamp=$cache/community-crypto.from
(
    flock 9
    if [ "$(cat "$stamp" 2>/dev/null)" = "$ansible_pkg" ] \
        && [ -n "$(find "$cache" -maxdepth 1 -name 'community-crypto-*.tar.gz' -print -quit)" ]; then
        exit 0
    fi
    tmp=$(mktemp -d "$cache/.crypto.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    "$py" -m pip download -q --no-deps -d "$tmp" "$ansible_pkg"
    wheel=$(find "$tmp" -name 'ansible-*.whl' | head -n 1)
    [ -n "$wheel" ] || die "no wheel of $ansible_pkg"
    find "$cache" -maxdepth 1 -name 'community-crypto-*.tar.gz' -delete
    # the collection's files out of the wheel, as a collection tarball (names without "./")
    "$py" - "$wheel" "$cache" <<'PY'
import gzip, hashlib, io, json, os, sys, tarfile, zipfile
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
# gzip and tar without times: the same package gives the same bytes
with gzip.GzipFile(out + ".tmp", "wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as t:
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
    echo "$ansible_pkg" >"$stamp"
) 9>"$cache/.crypto.lock" >&2
find "$cache" -maxdepth 1 -name 'community-crypto-*.tar.gz' | sort | tail -n 1
