#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ansible-test sanity on a clean copy of the collection (ansible-test needs the
# ansible_collections/<ns>/<name> layout). Ignore files stay empty: fix, never ignore.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST="$ROOT/build/sanity/ansible_collections/hpc/podnet"
rm -rf "$ROOT/build/sanity"
mkdir -p "$DEST"
# exactly what the collection ships: the tarball `ansible-galaxy collection build` makes from
# the tracked and new (not ignored) files (galaxy.yml's build_ignore keeps the tests, the lab
# and the developer's files out), plus galaxy.yml (the version), tests/config.yml and the (empty)
# ignore files
STAGE="$ROOT/build/sanity/stage"
mkdir -p "$STAGE/src" "$STAGE/dist"
(cd "$ROOT" && git ls-files -co --exclude-standard -z) \
  | (cd "$ROOT" && rsync -a --from0 --files-from=- ./ "$STAGE/src/")
(cd "$STAGE" && ansible-galaxy collection build --output-path "$STAGE/dist" "$STAGE/src" >/dev/null)
tar -C "$DEST" -xzf "$STAGE"/dist/hpc-podnet-*.tar.gz
rm -f "$DEST/MANIFEST.json" "$DEST/FILES.json"
(cd "$ROOT" && git ls-files -co --exclude-standard -z -- galaxy.yml tests/sanity tests/config.yml) \
  | (cd "$ROOT" && rsync -a --from0 --files-from=- ./ "$DEST/")
rm -rf "$STAGE"
for f in "$DEST"/tests/sanity/ignore-*.txt; do
  [ -e "$f" ] || continue
  if [ -s "$f" ]; then echo "sanity: $f is not empty" >&2; exit 1; fi
done
cd "$DEST"
# ansible-test's own output (its delegation venv) is not the collection's
printf 'tests/output/\n' >.gitignore
git init -q . && git add -A && git -c user.email=ci@podnet -c user.name=ci commit -qm sanity
# ansible-test bootstraps pip in its venvs with a script from a host we cannot
# reach; stand in with the interpreter's own ensurepip + pip (same result).
PIPVER=$(python3 - <<'PY'
import pathlib, re, ansible_test
req = pathlib.Path(ansible_test.__file__).parent / "_data/requirements/ansible-test.txt"
m = re.search(r"^pip\s*==\s*(\S+)", req.read_text(), re.M)
print(m.group(1) if m else "24.2")
PY
)
GETPIP="$HOME/.ansible/test/cache/get_pip_${PIPVER//./_}.py"
mkdir -p "$(dirname "$GETPIP")"
  cat > "$GETPIP" <<'PY'
"""Offline stand-in for get-pip.py: ensurepip, then pip install <args>."""
import ensurepip
import sys

ensurepip.bootstrap(upgrade=True)
from pip._internal.cli.main import main  # noqa: E402

# get-pip.py options that pip itself does not know
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(main(["install", *args]))
PY
PYVER=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
exec ansible-test sanity --color no --python "$PYVER" --venv --requirements "$@"
