#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Set podnet's version everywhere it is named, at once (docs/development.md "Cutting a release"):
#
#   tests/release/set-version.sh VERSION [TREE]     (TREE: default this checkout)
#
# galaxy.yml, agent/pyproject.toml, agent/src/podnet/__init__.py, and the roles' defaults
# agent_version, spank_native_version, sshd_hooks_native_version with their
# meta/argument_specs.yml defaults and docs/roles tables. release.sh refuses a tree where they
# differ; this script checks each file changed (or already said VERSION) and stops otherwise.
set -euo pipefail
version=${1:?usage: tests/release/set-version.sh VERSION [TREE]}
tree=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
die() { echo "set-version: $*" >&2; exit 1; }
# a version galaxy and PEP 440 both take: MAJOR.MINOR.PATCH
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "'$version' is not MAJOR.MINOR.PATCH"
[ -f "$tree/galaxy.yml" ] || die "$tree: no galaxy.yml"

# FILE SED-ADDRESS-REGEX PREFIX SUFFIX: the one line matching the regex becomes PREFIX VERSION SUFFIX
set_line() {
    local file=$tree/$1 re=$2 prefix=$3 suffix=$4 n
    [ -f "$file" ] || die "$1: missing"
    n=$(grep -c -E "$re" "$file" || true)
    [ "$n" = 1 ] || die "$1: $n lines match '$re' (want 1)"
    sed -i -E "s/$re/$prefix$version$suffix/" "$file"
    grep -q -F "$prefix$version$suffix" "$file" || die "$1: not set"
}
v='[0-9]+\.[0-9]+\.[0-9]+'
set_line galaxy.yml "^version: *$v\$" 'version: ' ''
set_line agent/pyproject.toml "^version *= *\"$v\"\$" 'version = "' '"'
set_line agent/src/podnet/__init__.py "^__version__ *= *\"$v\"\$" '__version__ = "' '"'
for var in agent/agent_version spank/spank_native_version sshd_hooks/sshd_hooks_native_version; do
    role=${var%%/*} name=${var#*/}
    set_line "roles/$role/defaults/main.yml" "^$name: *\"$v\"\$" "$name: \"" '"'
    # the argument spec's default: the line after "<name>:" that says "default:"
    spec=$tree/roles/$role/meta/argument_specs.yml
    python3 - "$spec" "$name" "$version" <<'PY'
import re
import sys

path, name, version = sys.argv[1:]
lines = open(path).read().split("\n")
start = next((i for i, line in enumerate(lines) if re.match(rf"^\s+{re.escape(name)}:\s*$", line)), None)
if start is None:
    sys.exit(f"set-version: {path}: no option {name}")
indent = len(lines[start]) - len(lines[start].lstrip())
for i in range(start + 1, len(lines)):
    line = lines[i]
    if line.strip() and len(line) - len(line.lstrip()) <= indent:
        break
    m = re.match(r"^(\s+default:\s*)\"?[0-9]+\.[0-9]+\.[0-9]+\"?\s*$", line)
    if m:
        lines[i] = f'{m.group(1)}"{version}"'
        open(path, "w").write("\n".join(lines))
        sys.exit(0)
sys.exit(f"set-version: {path}: {name} has no version default")
PY
    set_line "docs/roles/$role.md" "^\| \`$name\` \| str \| \`$v\` \|" "| \`$name\` | str | \`" '` |'
done
echo "set-version: $version in $tree"
