#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# apptainer-mkroot.sh DIR [BINARY...]: a tiny root file system from the node's own binaries
# (the lab has no image registry), for `apptainer build IMAGE.sif DIR`: sh, id, cat,
# readlink, sleep and the BINARYs given, with their libraries. Used by the e2e tests
# (test_apptainer.install_mkroot) and the molecule scenario apptainer
# (tests/molecule/apptainer/verify.yml).
set -e
d=$1
shift
rm -rf "$d"
mkdir -p "$d/bin" "$d/etc" "$d/proc" "$d/sys" "$d/dev" "$d/tmp"
for b in /bin/sh /usr/bin/id /bin/cat /bin/readlink /bin/sleep "$@"; do
    cp "$b" "$d/bin/"
    for l in $(ldd "$b" | grep -o '/[^ ]*'); do
        mkdir -p "$d$(dirname "$l")"
        cp -n "$l" "$d$l"
    done
done
echo podnet-test-image >"$d/etc/podnet-image"
