#!/usr/bin/env bash
# `make fuzz`: the suite's fuzz tests of the entrances, longer and with other cases, on the
# embedded defaults (SQLite, the filesystem store: no services to start).
#   scripts/fuzz.sh [--entrances rest,sqs,console] [--examples N] [--seed N|random|fixed]
#                   [--log FILE] [-- PYTEST ARGS...]
# --entrances  which of tests/integration/test_fuzz_{rest,sqs,console}.py run (all by default)
# --examples   cases of each fuzz test (each test's own count in `make test`; 500 by default here)
# --seed       random (by default): new cases, with the seed printed to replay them (--seed N);
#              fixed: the suite's own cases (derandomized), as `make test` runs them
# --log FILE   every case appended to FILE, one line each (entrance, status, what was called)
# The cases per entrance and their statuses are printed at the end; any 5xx fails the run, with
# the failing case shrunk by hypothesis. The same tests run in `make test` on PostgreSQL, with
# fewer cases (tests/fuzzing.py).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

entrances="rest,sqs,console"
examples=500
seed=random
log=""
while [ $# -gt 0 ]; do
    case "$1" in
        --entrances) entrances="$2"; shift 2 ;;
        --examples) examples="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        --log) log="$(realpath -m "$2")"; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "fuzz: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    esac
done

modules=()
IFS=',' read -r -a names <<< "$entrances"
for name in "${names[@]}"; do
    case "$name" in
        rest|sqs|console) modules+=("tests/integration/test_fuzz_$name.py") ;;
        *) echo "fuzz: unknown entrance '$name' (rest, sqs, console)" >&2; exit 2 ;;
    esac
done
case "$examples" in
    ''|*[!0-9]*) echo "fuzz: --examples takes a number of cases, not '$examples'" >&2; exit 2 ;;
esac
case "$seed" in
    random) seed="$(python3 -c 'import random; print(random.randrange(2**31))')" ;;
    fixed) seed="" ;;
    *[!0-9]*|'') echo "fuzz: --seed takes a number, random or fixed, not '$seed'" >&2; exit 2 ;;
esac

venv="$(scripts/venv.sh | tail -n 1)"
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
# The embedded defaults, whatever the shell has exported for services.
unset DATABASE_URL KV_URL REDIS_URL CELERY_BROKER_URL CELERY_RESULT_BACKEND MQ_TEST_PG_URL MQ_TEST_REDIS_URL MQ_TEST_REDIS_CLUSTER_URL
data="$(mktemp -d "${TMPDIR:-/tmp}/mq-fuzz.XXXXXX")"
trap 'rm -rf "$data"' EXIT
export MQ_DATA_DIR="$data" DJANGO_SETTINGS_MODULE=config.settings
export MQ_FUZZ_EXAMPLES="$examples" MQ_FUZZ_SEED="$seed" MQ_FUZZ_LOG="$log"

echo "fuzz: ${entrances} on SQLite, ${examples} cases a test, seed ${seed:-fixed} (replay: --seed ${seed:-fixed})" >&2
rc=0
# (no per-test time limit: a long run's test takes as long as its cases)
python -m pytest -p no:randomly --timeout=0 "${modules[@]}" "$@" || rc=$?
[ "$rc" -eq 0 ] || echo "fuzz: FAILED (pytest exit code $rc); replay: scripts/fuzz.sh --entrances ${entrances} --examples ${examples} --seed ${seed:-fixed}" >&2
exit "$rc"
