#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# All static checks (make lint): yamllint, antsibull-changelog (fragments), ansible-lint (production), ruff, mypy, import-linter,
# antsibull-docs' docs linter, ansible-test sanity on what the collection ships (empty
# ignore files), the man pages, shellcheck, promtool (the alert rules the collection ships and their tests).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
step() { printf '\n== %s\n' "$*"; }

step yamllint
yamllint -s .

step "antsibull-changelog lint"
antsibull-changelog lint
antsibull-changelog lint-changelog-yaml changelogs/changelog.yaml

step ansible-lint
ansible-lint --profile production --offline -q

step ruff
ruff check agent plugins tests
ruff format --check agent plugins tests

step mypy
mypy agent/src plugins

step "import-linter (the agent's layers, no import circle)"
(cd agent && PYTHONPATH="$ROOT/agent/src" lint-imports --no-cache)

step "antsibull-docs lint-collection-docs"
ANSIBLE_COLLECTIONS_PATH="$ROOT/build/collections" \
  antsibull-docs lint-collection-docs --plugin-docs "$ROOT/build/collections/ansible_collections/hpc/podnet"

step "ansible-test sanity"
"$ROOT/tests/sanity.sh"

step "promtool (files/prometheus: check the rules, then their tests)"
promtool=${PODNET_PROMTOOL:-${PODNET_CACHE_DIR:-/var/cache/podnet-dev}/artifacts/promtool/usr/bin/promtool}
[ -x "$promtool" ] || { echo "lint: $promtool missing (make artifacts fetches Debian's promtool)" >&2; exit 1; }
"$promtool" check rules files/prometheus/*.rules.yml
(cd tests/prometheus && "$promtool" test rules ./*.test.yml)

step "man pages (roles/*/files/man are docs/man/*.md rendered)"
"$ROOT/tests/man.sh" --check

step "shellcheck"
mapfile -t scripts < <(git ls-files '*.sh' .ci/run)
shellcheck "${scripts[@]}"

echo "lint: all clean"
