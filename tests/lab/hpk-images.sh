#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The lab's HPK images (docs/hpk.md): /shared/images/busybox.sif, built on one node of the lab
# (Apptainer is there once site.yml ran) from Debian's busybox-static (the lab image's): every
# applet (sh, httpd, wget, nc, ...) linked, a runscript that runs its arguments (or sh), made
# readable by everyone; iputils' ping (unprivileged ICMP) in place of busybox's. Skipped
# when it exists and was built from the same inputs.
#   tests/lab/hpk-images.sh [NODE]     (LAB_NAME as for lab.sh; NODE default c1)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
node=${1:-c1}
inputs=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)
"$here/lab.sh" ssh "root@$node" bash -s "$inputs" <<'EOS'
set -euo pipefail
inputs=$1
out=/shared/images/busybox.sif
if [ -s "$out" ] && [ "$(cat "$out.inputs" 2>/dev/null)" = "$inputs" ]; then
    echo "hpk-images: $out cached"
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
for lib in $(ldd /usr/bin/ping | grep -o '/[^ ]*'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
printf 'export PATH=/bin\n' >"$root/.singularity.d/env/90-podnet.sh"
printf '#!/bin/sh\nif [ $# -eq 0 ]; then exec /bin/sh; fi\nexec "$@"\n' >"$root/.singularity.d/runscript"
chmod 0755 "$root/.singularity.d/runscript"
echo busybox >"$root/etc/podnet-image"
apptainer -q build -F "$tmp/busybox.sif" "$root" >/dev/null
install -m 0644 "$tmp/busybox.sif" "$out.tmp"
mv -f "$out.tmp" "$out"
echo "$inputs" >"$out.inputs"
echo "hpk-images: built $out ($(stat -c %s "$out") bytes)"
EOS
