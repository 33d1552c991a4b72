#!/usr/bin/env python
"""The engine compiled with mypyc against the same engine in pure Python, side by side.

It MEASURES AND PRINTS; it never passes or fails. It copies this checkout's files (those git
knows, as they are now) to a temporary folder, compiles ``--modules`` of ``queues/engine``
there with mypyc (which ships with mypy; it needs a C compiler and Python's headers), then
runs ``bench/inprocess.py`` with the same arguments in the pure checkout and in the compiled
copy, alternately (each first in every other round), ``--runs`` times each, and prints every
run's figure and the medians. The
checkout itself is never changed: nothing of the service imports a compiled module unless
one was built beside its source.

    scripts/with-services.sh python bench/compiled.py --runs 3 -- --kv redis --batch 100 --n 20000

The default modules are the ones a message's enqueue, dequeue and ack run through;
``queues/engine/ports.py`` is left out (a generic class there does not import compiled).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import exit_on_sigterm

REPO = Path(__file__).resolve().parent.parent
HOT = [
    "acks",
    "blocks",
    "body_cache",
    "cursor",
    "deadlines",
    "delivery",
    "format",
    "ids",
    "keys",
    "ordering",
    "redelivery",
    "tree",
    "writer",
]
FIGURE = re.compile(r"node CPU ([\d.]+) µs/msg, ([\d.]+) µs/call")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--modules", default=",".join(HOT), help="queues/engine modules to compile, comma-separated")
    p.add_argument("--runs", type=int, default=3, help="runs of bench/inprocess.py in each tree, alternating")
    p.add_argument("inprocess", nargs=argparse.REMAINDER, help="after --: bench/inprocess.py's arguments")
    args = p.parse_args(argv)
    args.inprocess = [a for a in args.inprocess if a != "--"] or ["--kv", "redis", "--batch", "100"]
    return args


def copy_checkout(to: Path) -> None:
    """The files git knows (tracked, and untracked ones not ignored), as they are now."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in names:
        if not raw:
            continue
        src = REPO / raw.decode()
        if src.is_file():
            (to / raw.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, to / raw.decode())


def compile_engine(tree: Path, modules: list[str]) -> None:
    paths = [f"queues/engine/{m}.py" for m in modules]
    r = subprocess.run([sys.executable, "-m", "mypyc", *paths], cwd=tree, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        sys.exit(f"mypyc failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    missing = [m for m in modules if not any((tree / "queues/engine").glob(f"{m}.*.so"))]
    if missing:
        sys.exit(f"mypyc built no extension of {', '.join(missing)}")
    # and what the copy imports is the extension, not the source beside it
    code = "import importlib, sys\nfor m in sys.argv[1:]: print(importlib.import_module(f'queues.engine.{m}').__file__)"
    r = subprocess.run([sys.executable, "-c", code, *modules], cwd=tree, capture_output=True, text=True, check=False)
    loaded = r.stdout.split()
    if r.returncode != 0 or len(loaded) != len(modules) or not all(f.endswith(".so") for f in loaded):
        sys.exit(f"the compiled copy does not import its extensions: {r.stdout[-2000:]}{r.stderr[-2000:]}")


def run(tree: Path, argv: list[str]) -> tuple[float, float]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    r = subprocess.run(
        [sys.executable, "bench/inprocess.py", *argv], cwd=tree, env=env, capture_output=True, text=True, check=False
    )
    m = FIGURE.search(r.stdout)
    if r.returncode != 0 or m is None:
        sys.exit(f"bench/inprocess.py failed in {tree}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return float(m.group(1)), float(m.group(2))


def main(argv: list[str] | None = None) -> None:
    exit_on_sigterm()
    args = parse_args(argv)
    modules = [m for m in args.modules.split(",") if m]
    with tempfile.TemporaryDirectory(prefix="mq-compiled-") as tmp:
        tree = Path(tmp)
        copy_checkout(tree)
        compile_engine(tree, modules)
        print(f"compiled with mypyc: {', '.join(modules)}")
        print(f"bench/inprocess.py {' '.join(args.inprocess)}; µs of node CPU a message (a call)")
        pure: list[float] = []
        compiled: list[float] = []
        trees = [("pure", REPO, pure), ("compiled", tree, compiled)]
        for i in range(args.runs):
            for name, where, figures in trees if i % 2 == 0 else trees[::-1]:  # each first in turn
                per_message, per_call = run(where, args.inprocess)
                figures.append(per_message)
                print(f"run {i + 1} {name:>8}: {per_message:.1f} ({per_call:.0f})", flush=True)
    a, b = statistics.median(pure), statistics.median(compiled)
    print(f"median: pure {a:.1f}, compiled {b:.1f} µs a message; compiled / pure {b / a:.2f}x")


if __name__ == "__main__":
    main()
