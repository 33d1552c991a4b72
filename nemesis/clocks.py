"""Clock drift for the nemesis run: a process whose clocks run fast or slow, and whose wall
clock is offset, with libfaketime (Debian's ``faketime`` package) preloaded into it.

``Drift(rate=1.05, offset_s=120).env()`` is the environment to add to a process's at its start:
every clock it reads (``time.time()``, ``time.monotonic()``, ``CLOCK_BOOTTIME``, even
``CLOCK_MONOTONIC_RAW``) then runs at ``rate`` seconds per real second from the moment it
started, the wall clock ``offset_s`` seconds ahead (behind when negative); its sleeps and the
timeouts of its waits last ``1 / rate`` real seconds per second of its own. Measured on Debian
12 (libfaketime 0.9.10, CPython 3.11, glibc 2.36): a child's monotonic and wall clocks ran at
1.100 and 0.900 of the parent's over 2 s, its offset within 10 ms of the one asked;
``time.sleep``, ``Lock.acquire``, ``Condition.wait``, ``Event.wait``, ``queue.get``, socket and
selector timeouts all lasted 1 s on the child's clock (tests/integration/test_nemesis_clocks.py).

Two things make this more than setting ``FAKETIME``:

- libfaketime reports every clock on the wall clock's scale (the monotonic clock reads about
  1.8e9, the time since 1970, offset included) and does not intercept ``sem_clockwait()``, so
  CPython's timed lock waits (``Lock.acquire(timeout=...)``, hence ``Condition.wait``,
  ``Event.wait``, ``queue.get``) wait for decades under any ``FAKETIME``, ``"+0"`` included.
  ``faketime_waits.c``, built here on first use into a small library preloaded before
  libfaketime, makes those waits (and ``pthread_cond_clockwait()``) keep their deadline on the
  process's own clock. ``FAKETIME_FORCE_MONOTONIC_FIX=1`` does the same for
  ``pthread_cond_timedwait()`` on a monotonic condition (CPython's GIL hand-over).
- **A drift is set when the process starts and holds until it exits.** libfaketime can re-read
  its setting from a file while a process runs, but (measured) a change of rate then moves the
  monotonic clock as if the new rate had held since the start (1.1 then 1.0 after 2 s: a step
  back of 0.2 s), a change of offset steps the monotonic clock too, and with
  ``FAKETIME_XRESET`` the rate changes smoothly but the monotonic clock can still step back by
  as much as the time since the process last read its wall clock (0.16 s measured), and a new
  offset is ignored. A monotonic clock that steps back is outside every model the service
  makes, so a run changes a node's drift by restarting the node with a new one.

Each process starts its own faked clock: a child process started with the same environment
(a node's worker processes) starts at real time plus the offset, not at its parent's faked
time, and both then run at the rate.

Not faked: programs linked statically or that read the clock with the raw system call (Go),
and Rust's own timed waits (futex with a deadline from the faked monotonic clock) would wait as
CPython's did; granian's server loop waits in ``epoll_wait`` with a relative timeout.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: libfaketime's thread-safe variant (the plain one caches state without locks).
LIBRARY_NAME = "libfaketimeMT.so.1"
#: Where Debian's libfaketime package puts it (one folder per architecture).
LIBRARY_GLOB = "/usr/lib/*/faketime/" + LIBRARY_NAME
#: The timed-wait companion's source, beside this module.
COMPANION_SOURCE = Path(__file__).with_name("faketime_waits.c")
#: Rates outside these bounds are refused: the companion waits in slices of half the time left,
#: which overshoots a deadline once the rate reaches 2; a run asks for 0.9 to 1.1.
MIN_RATE, MAX_RATE = 0.5, 1.9


class ClockError(RuntimeError):
    """libfaketime is missing, or its companion library would not build."""


def library() -> Path:
    """The installed ``libfaketimeMT.so.1`` (``scripts/services.sh packages`` installs it)."""
    found = sorted(glob.glob(LIBRARY_GLOB))
    if not found:
        raise ClockError(f"no {LIBRARY_GLOB}: install the Debian package faketime (scripts/services.sh packages)")
    return Path(found[0])


def cache_dir() -> Path:
    """Where the companion library is built: ``$XDG_CACHE_HOME/mq`` (``~/.cache/mq``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mq"


def companion() -> Path:
    """The timed-wait companion library, built from ``faketime_waits.c`` with ``cc`` the first
    time (its file name carries the source's hash, so a changed source builds anew)."""
    source = COMPANION_SOURCE.read_bytes()
    target = cache_dir() / f"faketime-waits-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if target.exists():
        return target
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise ClockError("no C compiler (cc) to build nemesis/faketime_waits.c: install gcc")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target.parent, suffix=".so.partial")
    os.close(fd)
    try:
        built = subprocess.run(  # noqa: S603 - the compiler on our own source file
            [cc, "-O2", "-shared", "-fPIC", "-Wall", "-o", partial, str(COMPANION_SOURCE), "-ldl"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if built.returncode != 0:
            raise ClockError(f"building {COMPANION_SOURCE.name} failed: {built.stderr.strip()}")
        os.replace(partial, target)  # whole or not at all, also with runs side by side
    finally:
        Path(partial).unlink(missing_ok=True)
    return target


def available() -> tuple[bool, str]:
    """Whether this machine can drift a process's clocks, and why not when it cannot."""
    try:
        library()
        companion()
    except (ClockError, OSError, subprocess.SubprocessError) as e:
        return False, str(e)
    return True, "libfaketime and its companion"


@dataclass(frozen=True)
class Drift:
    """A process's clocks: ``rate`` seconds of its own per real second (monotonic and wall),
    its wall clock ``offset_s`` seconds ahead of the real one (behind when negative)."""

    #: Seconds of the process's clocks per real second, from its start.
    rate: float = 1.0
    #: Seconds between its wall clock and the real one at its start.
    offset_s: float = 0.0

    def __post_init__(self) -> None:
        if not MIN_RATE <= self.rate <= MAX_RATE:
            raise ValueError(f"rate must be within {MIN_RATE}..{MAX_RATE}, not {self.rate}")

    @property
    def spec(self) -> str:
        """libfaketime's ``FAKETIME`` value: a relative offset and a rate (``+120.000 x1.05``)."""
        return f"{self.offset_s:+.3f} x{self.rate:.6f}"

    def env(self) -> dict[str, str]:
        """The environment to add to a process's when it starts, for this drift."""
        preload = f"{companion()}:{library()}"
        inherited = os.environ.get("LD_PRELOAD")
        return {
            "LD_PRELOAD": f"{preload}:{inherited}" if inherited else preload,
            "FAKETIME": self.spec,
            # a monotonic condition variable's deadline converted to the real clock (CPython's GIL)
            "FAKETIME_FORCE_MONOTONIC_FIX": "1",
        }


def env_for(rate: float = 1.0, offset_s: float = 0.0) -> dict[str, str]:
    """``Drift(rate, offset_s).env()``."""
    return Drift(rate, offset_s).env()
