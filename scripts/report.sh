# Sourced by scripts/test.sh and scripts/test-unit.sh: `report RC LABEL` says why a pytest run
# failed (exit 5: it collected no tests), prefixed with $REPORT_AS (the make target).
report() {   # rc label
    case "$1" in
        0) ;;
        5) echo "$REPORT_AS: FAILED: ${2}pytest collected no tests (exit 5)" >&2 ;;
        *) echo "$REPORT_AS: FAILED (${2}pytest exit code $1)" >&2 ;;
    esac
}
