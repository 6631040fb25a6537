#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The man pages from their sources in docs/man/*.md (go-md2man, Debian's package):
#
#   tests/man.sh            writes them where the roles install them from
#   tests/man.sh --check    fails when one there differs from its source (make lint)
#
# podnet-container(1) goes with the SPANK role (which installs podnet-container), the others
# with the agent role (podnet, podnetd).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
check=0
[ "${1:-}" != --check ] || check=1
command -v go-md2man >/dev/null || { echo "man.sh: go-md2man missing (make host-deps)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
for src in "$ROOT"/docs/man/*.md; do
    page=$(basename "$src" .md)  # podnet.1
    case "$page" in
        podnet-container.*) role=spank ;;
        *) role=agent ;;
    esac
    dest="$ROOT/roles/$role/files/man/$page"
    go-md2man -in "$src" -out "$tmp/$page"
    if [ "$check" = 1 ]; then
        cmp -s "$tmp/$page" "$dest" || {
            echo "man.sh: ${dest#"$ROOT"/} is not docs/man/$page.md rendered: run make man" >&2
            rc=1
        }
    else
        mkdir -p "$(dirname "$dest")"
        cp "$tmp/$page" "$dest"
        echo "${dest#"$ROOT"/}"
    fi
done
exit "$rc"
