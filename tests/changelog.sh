#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# CHANGELOG.md from changelogs/ with antsibull-changelog (docs/development.md "Changelog"):
#   tests/changelog.sh           writes build/changelog/CHANGELOG.md (a preview)
#   tests/changelog.sh --write   and copies it to CHANGELOG.md (make changelog)
# Released versions come from changelogs/changelog.yaml; the fragments of the version in
# galaxy.yml that is not released yet are shown as that version, marked "(unreleased)".
# This runs `antsibull-changelog release` on a scratch copy, so the fragments stay where they
# are; the release itself is `antsibull-changelog release` in the tree (it consumes them).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK="$ROOT/build/changelog"
COLL="$WORK/ansible_collections/hpc/podnet"
rm -rf "$WORK"
mkdir -p "$COLL"
cp -a "$ROOT/galaxy.yml" "$ROOT/changelogs" "$ROOT/plugins" "$ROOT/meta" "$COLL/"
rm -f "$COLL/changelogs/.plugin-cache.yaml"
# build/ is ignored by git: with vcs auto antsibull-changelog would hand ansible-doc only the
# files git tracks below it (none), and list no new modules
sed -i 's/^vcs: .*/vcs: none/' "$COLL/changelogs/config.yaml"
VERSION=$(sed -n 's/^version: *//p' "$ROOT/galaxy.yml")
released=$(python3 - "$COLL/changelogs/changelog.yaml" "$VERSION" <<'PY'
import sys, yaml
data = yaml.safe_load(open(sys.argv[1])) or {}
print("yes" if sys.argv[2] in (data.get("releases") or {}) else "no")
PY
)
cd "$COLL"
export ANSIBLE_COLLECTIONS_PATH="$WORK"
if [ "$released" = no ] && compgen -G "changelogs/fragments/*.yml" >/dev/null; then
  antsibull-changelog release --version "$VERSION" --date "$(date -u +%F)"
  python3 - "$VERSION" <<'PY'
import pathlib, sys
p = pathlib.Path("CHANGELOG.md")
head = "## v" + sys.argv[1].replace(".", "\\.")
p.write_text(p.read_text().replace("\n" + head + "\n", "\n" + head + " \\(unreleased\\)\n", 1))
PY
else
  antsibull-changelog generate
fi
echo "changelog: $COLL/CHANGELOG.md"
if [ "${1:-}" = --write ]; then
  cp "$COLL/CHANGELOG.md" "$ROOT/CHANGELOG.md"
  echo "changelog: wrote $ROOT/CHANGELOG.md"
fi
