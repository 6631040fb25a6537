#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One suite of `make test` (Makefile, test): runs the command, its output shown and kept in
# build/suites/NAME.log, and adds "NAME: passed in N s" or "NAME: FAILED (exit R) after N s"
# to build/suites/summary.txt, which `make test` prints last (a CI log keeps its tail).
#   tests/suite.sh NAME COMMAND [ARG...]
set -uo pipefail
[ "$#" -ge 2 ] || { echo "usage: $0 NAME COMMAND [ARG...]" >&2; exit 2; }
name=$1
shift
dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build/suites
mkdir -p "$dir"
t0=$SECONDS
"$@" 2>&1 | tee "$dir/$name.log"
rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ]; then
    line="$name: passed in $((SECONDS - t0)) s"
else
    line="$name: FAILED (exit $rc) after $((SECONDS - t0)) s (log build/suites/$name.log)"
fi
printf '%s\n' "$line" >>"$dir/summary.txt"  # one short O_APPEND write: the two sides never interleave
echo "==== $line"
exit "$rc"
