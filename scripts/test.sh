#!/usr/bin/env bash
# `make test`: pytest against real PostgreSQL + Redis (started here, always stopped afterwards).
#   scripts/test.sh [PYTEST ARGS...]        e.g. scripts/test.sh -k lease -x
# Exits with pytest's exit code; exit 5 (no tests collected) is reported as a failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rc=0
"$here/with-services.sh" python -m pytest "$@" || rc=$?
case "$rc" in
    0) ;;
    5) echo "make test: FAILED: pytest collected no tests (exit 5)" >&2 ;;
    *) echo "make test: FAILED (pytest exit code $rc)" >&2 ;;
esac
exit "$rc"
