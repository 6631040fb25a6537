#!/usr/bin/env bash
# All static checks (make lint): yamllint, ansible-lint (production), ruff, mypy,
# ansible-test sanity on the collection (empty ignore files), C warnings.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
step() { printf '\n== %s\n' "$*"; }

step yamllint
yamllint -s .

step ansible-lint
ansible-lint --profile production --offline -q

step ruff
ruff check agent plugins tests
ruff format --check agent plugins tests

step mypy
mypy agent/src plugins

step "ansible-test sanity"
"$ROOT/tests/sanity.sh"

step "shellcheck"
mapfile -t scripts < <(git ls-files '*.sh' .ci/run)
shellcheck "${scripts[@]}"

echo "lint: all clean"
