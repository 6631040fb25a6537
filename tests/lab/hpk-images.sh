#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The lab's HPK images (docs/hpk.md), built on one node of the lab (Apptainer is there once
# site.yml ran) from the lab image's Debian packages, made readable by everyone:
# - /shared/images/busybox.sif: Debian's busybox-static, every applet (sh, httpd, wget, nc, ...)
#   linked, a runscript that runs its arguments (or sh); iputils' ping (unprivileged ICMP) in
#   place of busybox's;
# - /shared/images/python.sif (also python_3.sif): the same plus Debian's python3 (the
#   interpreter, the libraries it links and its standard library).
# Skipped when both exist and were built from the same inputs.
#   tests/lab/hpk-images.sh [NODE]     (LAB_NAME as for lab.sh; NODE default c1)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
node=${1:-c1}
inputs=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)
"$here/lab.sh" ssh "root@$node" bash -s "$inputs" <<'EOS'
set -euo pipefail
inputs=$1
out=/shared/images/busybox.sif
py=/shared/images/python.sif
if [ -s "$out" ] && [ -s "$py" ] && [ "$(cat "$out.inputs" 2>/dev/null)" = "$inputs" ]; then
    echo "hpk-images: $out and $py cached"
    exit 0
fi
tmp=$(mktemp -d /tmp/hpk-busybox.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
mkdir -p "$root/bin" "$root/etc" "$root/tmp" "$root/proc" "$root/sys" "$root/dev" "$root/root" \
    "$root/var/www" "$root/.singularity.d/env"
cp /bin/busybox "$root/bin/busybox"
for a in $("$root/bin/busybox" --list); do
    [ "$a" = busybox ] || ln -s busybox "$root/bin/$a"
done
ln -s bin "$root/sbin"
# iputils' ping instead of busybox's (which needs a raw socket: root): unprivileged ICMP
# through the pod's ping_group_range, with the libraries it links
rm -f "$root/bin/ping"
cp /usr/bin/ping "$root/bin/ping"
libs() {  # the shared libraries an executable links, copied under the root file system
    local lib
    for lib in $(ldd "$1" | grep -o '/[^ ]*'); do
        mkdir -p "$2$(dirname "$lib")"
        cp -L "$lib" "$2$lib"
    done
}
libs /usr/bin/ping "$root"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
printf 'export PATH=/bin\n' >"$root/.singularity.d/env/90-podnet.sh"
printf '#!/bin/sh\nif [ $# -eq 0 ]; then exec /bin/sh; fi\nexec "$@"\n' >"$root/.singularity.d/runscript"
chmod 0755 "$root/.singularity.d/runscript"
echo busybox >"$root/etc/podnet-image"
apptainer -q build -F "$tmp/busybox.sif" "$root" >/dev/null
install -m 0644 "$tmp/busybox.sif" "$out.tmp"
mv -f "$out.tmp" "$out"
echo "hpk-images: built $out ($(stat -c %s "$out") bytes)"
# python: the busybox root plus Debian's python3 (its stdlib without the test suite)
pyexe=$(readlink -f /usr/bin/python3)
pyver=$(basename "$pyexe")
mkdir -p "$root/usr/bin" "$root/usr/lib"
cp "$pyexe" "$root/usr/bin/$pyver"
ln -s "$pyver" "$root/usr/bin/python3"
ln -s python3 "$root/usr/bin/python"
libs "$pyexe" "$root"
cp -a "/usr/lib/$pyver" "$root/usr/lib/$pyver"
rm -rf "$root/usr/lib/$pyver/test" "$root/usr/lib/$pyver/site-packages" \
    "$root/usr/lib/$pyver/dist-packages" "$root/usr/lib/$pyver"/config-*
# the extension modules' own libraries (ssl, sqlite, ...)
for so in "$root/usr/lib/$pyver/lib-dynload"/*.so; do
    libs "$so" "$root"
done
printf 'export PATH=/usr/bin:/bin\n' >"$root/.singularity.d/env/90-podnet.sh"
echo python >"$root/etc/podnet-image"
apptainer -q build -F "$tmp/python.sif" "$root" >/dev/null
install -m 0644 "$tmp/python.sif" "$py.tmp"
mv -f "$py.tmp" "$py"
ln -sfn python.sif /shared/images/python_3.sif
echo "hpk-images: built $py ($(stat -c %s "$py") bytes)"
echo "$inputs" >"$out.inputs"
EOS
