#!/usr/bin/env bash
# Print (last line of stdout) the path of a ready virtualenv for this repo.
#
#   path: ${MQ_VENV:-$HOME/.cache/mq/venv-<first 12 hex of sha256(requirements.txt + requirements-dev.txt)>}
#
# It holds the runtime (requirements.txt) and the test, benchmark and lint tools
# (requirements-dev.txt, which includes requirements.txt). Clones on the same machine share it;
# editing either file yields a new path (a new venv).
# The build happens in a staging directory that is renamed into place only when it is complete,
# so an interrupted build is never mistaken for a ready venv. Progress goes to stderr.
# Env: MQ_VENV (override the path), MQ_PYTHON (interpreter, default python3.11).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
req="$repo/requirements.txt"
dev="$repo/requirements-dev.txt"     # `-r requirements.txt` plus the tools; this is what gets installed
python="${MQ_PYTHON:-python3.11}"

for f in "$req" "$dev"; do
    [ -f "$f" ] || { echo "venv.sh: $f not found" >&2; exit 1; }
done
# Both files, in a fixed order, so a change to either one changes the path.
hash="$(cat "$req" "$dev" | sha256sum | cut -c1-12)"
venv="${MQ_VENV:-$HOME/.cache/mq/venv-$hash}"
venv="${venv%/}"
marker="$venv/.mq-ready"        # contains the requirements hash; written last

log() { echo "venv.sh: $*" >&2; }

is_ready() {
    [ -f "$marker" ] && [ "$(cat "$marker" 2>/dev/null)" = "$hash" ] \
        && "$venv/bin/python" -c 'import sys' >/dev/null 2>&1
}

if is_ready; then
    echo "$venv"
    exit 0
fi

command -v "$python" >/dev/null 2>&1 || { log "$python not found (set MQ_PYTHON)"; exit 1; }

parent="$(dirname "$venv")"
mkdir -p "$parent"
# One builder at a time per venv path; others wait, then reuse its result.
exec 9>"$venv.lock"
if ! flock -n 9; then
    log "another build of $venv is running; waiting for it"
    flock 9
fi
if is_ready; then
    echo "$venv"
    exit 0
fi

# A venv is not relocatable: scripts get shebangs / VIRTUAL_ENV with the absolute path they were
# built at. So we build at a staging path and, after the rename, rewrite that path to the final one.
stage="$venv.building"
rm -rf "$stage" "$venv.old"
trap 'rm -rf "$stage"' EXIT

log "building $venv (from $(basename "$dev") + $(basename "$req"), sha256 $hash) with $("$python" --version 2>&1)"
"$python" -m venv --prompt "$(basename "$venv")" "$stage" >&2
"$stage/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip >&2
"$stage/bin/python" -m pip install --disable-pip-version-check -q -r "$dev" >&2
"$stage/bin/python" -m pip check >&2 || log "warning: pip check reported conflicts (see above)"

# Rename into place (an old incomplete/other-hash venv at the same path is moved aside first).
[ -e "$venv" ] && mv "$venv" "$venv.old"
mv "$stage" "$venv"
trap - EXIT
rm -rf "$venv.old"

# Fix absolute staging paths in bin/ text files (shebangs, activate*) and pyvenv.cfg.
while IFS= read -r -d '' f; do
    if grep -Iq . "$f" 2>/dev/null && grep -qF "$stage" "$f"; then
        sed -i "s|$stage|$venv|g" "$f"
    fi
done < <(find "$venv/bin" -maxdepth 1 -type f -print0)
sed -i "s|$stage|$venv|g" "$venv/pyvenv.cfg"

# Verify before declaring it ready.
"$venv/bin/python" -c 'import sys; assert sys.prefix == sys.argv[1], (sys.prefix, sys.argv[1])' "$venv" >&2
"$venv/bin/pip" --version >/dev/null
echo "$hash" >"$marker"
log "ready: $venv"
echo "$venv"
