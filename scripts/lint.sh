#!/usr/bin/env bash
# `make lint`: every check, each reported; exits non-zero if any failed (all of them run).
#   ruff check             the lint rules (pyproject.toml [tool.ruff.lint])
#   ruff format --check    the formatting
#   mypy                   strict types of every package, migrations aside (pyproject.toml [tool.mypy])
#   lint-imports           which package may import which ([tool.importlinter])
#   mkdocs build --strict  the documentation site (mkdocs.yml): no broken link, no page outside the nav
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
venv="$(scripts/venv.sh | tail -n 1)" || exit 1
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
export NO_MKDOCS_2_WARNING=1   # Material's end-of-life notice on every build

failed=()
check() {   # name cmd...
    local name="$1"
    shift
    echo "lint: $name" >&2
    "$@" || failed+=("$name")
}
check "ruff check" ruff check .
check "ruff format --check" ruff format --check .
check "mypy" mypy
check "lint-imports" lint-imports
docs_out="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 check "mkdocs build --strict" mkdocs build --strict --site-dir "$docs_out"
rm -rf "$docs_out"

if [ ${#failed[@]} -gt 0 ]; then
    echo "make lint: FAILED: $(IFS=,; echo "${failed[*]}" | sed 's/,/, /g')" >&2
    exit 1
fi
echo "make lint: all clean" >&2
