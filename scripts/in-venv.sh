#!/usr/bin/env bash
# Run a command from the repo root with the repo venv (scripts/venv.sh) first on PATH.
#   scripts/in-venv.sh mypy        scripts/in-venv.sh python manage.py check
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
[ $# -gt 0 ] || { echo "usage: $0 CMD [ARGS...]" >&2; exit 2; }
venv="$(scripts/venv.sh | tail -n 1)"
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
exec "$@"
