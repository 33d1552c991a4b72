"""The previous release, for a rolling upgrade: its code in a ``git worktree`` and its
virtualenv, both cached under ``~/.cache/mq/releases``.

The release is the commit that ``nemesis/previous-release`` names (its first word that is not a
comment). The worktree is made once per commit, detached; its virtualenv is built by that
commit's own ``scripts/venv.sh``, which shares one with this tree when the pins are the same.
Old code runs on the schema of the new (migrations only add), so a node of the previous release
starts on the run's database as it is.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The file that names the previous release.
NAMED_IN = ROOT / "nemesis" / "previous-release"
CACHE = Path(os.environ.get("MQ_RELEASES_DIR", Path.home() / ".cache" / "mq" / "releases"))


class ReleaseError(RuntimeError):
    """The previous release could not be checked out or its virtualenv built (the output says why)."""


@dataclass(frozen=True)
class Release:
    commit: str
    #: the release's tree: ``manage.py`` is here
    tree: Path
    #: the python of its virtualenv
    python: str


def named() -> str:
    """The commit ``nemesis/previous-release`` names."""
    for line in NAMED_IN.read_text().splitlines():
        word = line.split("#", 1)[0].strip()
        if word:
            return word
    raise ReleaseError(f"{NAMED_IN} names no commit")


def _git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)}: {done.stderr.strip()[-1000:]}")
    return done.stdout.strip()


def prepare(commit: str | None = None) -> Release:
    """The release's worktree and virtualenv, made if they are not there yet."""
    full = _git("rev-parse", "--verify", f"{commit or named()}^{{commit}}")
    tree = CACHE / full[:12]
    if not (tree / "manage.py").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        _git("worktree", "prune")
        _git("worktree", "add", "--force", "--detach", str(tree), full)
    done = subprocess.run(
        ["bash", str(tree / "scripts" / "venv.sh")], cwd=tree, capture_output=True, text=True, timeout=1800, check=False
    )
    if done.returncode != 0:
        raise ReleaseError(f"the release's scripts/venv.sh exited {done.returncode}: {done.stderr[-2000:]}")
    venv = Path(done.stdout.strip().splitlines()[-1])
    return Release(full, tree, str(venv / "bin" / "python"))
