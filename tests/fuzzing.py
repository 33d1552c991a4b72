"""Hostile values and the fuzzing's bookkeeping, shared by the fuzz tests of every entrance:
the REST API (``tests/integration/test_fuzz_rest.py``), the SQS API in both protocols
(``test_fuzz_sqs.py``) and the console (``test_fuzz_console.py``).

What every entrance must do with any input (DESIGN.md, "what must always hold", 6): answer a
clear 4xx, never a 5xx but a 503 with Retry-After (an outage, which a client retries; in
this process no outage happens, so there a 503 is a bug too: :func:`server_error`). The
values come in kinds (:data:`KINDS`), each a hypothesis strategy of JSON-ish values:

- ``numbers``: numbers past any range: integers of thousands of digits (past Python's 4,300-digit
  limit for text, as a literal: :class:`Raw`), past 32 and 64 bits, negative, floats, NaN and
  the infinities, and text that looks like a number and is none (``²``, ``1e3``, ``0x10``);
- ``nesting``: objects and arrays nested up to 5,000 deep, as a value and as JSON text inside a
  string (a RedrivePolicy, a Policy);
- ``types``: a value of another JSON type than the one expected (an object for a string...);
- ``control``: text with control characters, NUL, lone surrogates and non-characters;
- ``huge``: text of up to a MiB, and long lists and objects.

How many cases run: each test's own count in ``make test`` (a few seconds each, with a fixed
seed: hypothesis' ``derandomize``, so a red run is the change's, not the dice's);
``MQ_FUZZ_EXAMPLES=N`` runs N a test, ``MQ_FUZZ_SEED=random`` (or a number) other cases
(``scripts/fuzz.sh`` does both, on SQLite). Every case is counted per entrance
(:func:`record`) and the counts are printed at the end of the run (``tests/conftest.py``).
"""

from __future__ import annotations

import base64
import collections
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st

#: The kinds of hostile value, each a test of every entrance.
KINDS = ("numbers", "nesting", "types", "control", "huge")

#: Examples a test runs instead of its own count (``scripts/fuzz.sh --examples``); 0: its own.
EXAMPLES = int(os.environ.get("MQ_FUZZ_EXAMPLES", "0") or 0)
#: "" (the suite's): derandomized, the same cases every run; "random": other cases each run
#: (hypothesis prints the seed of a failure); a number: that seed's cases, again.
SEED = os.environ.get("MQ_FUZZ_SEED", "")
#: A file every case is appended to, one line each (entrance, status, what was called), to see
#: what a run reached (``scripts/fuzz.sh --log FILE``); "": none.
LOG = os.environ.get("MQ_FUZZ_LOG", "")
#: One example's longest time. Not a timing test: an example far past it is stuck (a long
#: poll that should not wait, a parse that grows with the square of its input).
DEADLINE = timedelta(seconds=30)


def fuzz_settings(examples: int) -> Callable[[Any], Any]:
    """Hypothesis' settings (and seed) of a fuzz test that runs ``examples`` cases in the suite:
    a decorator of its ``@given`` test."""
    chosen = settings(
        max_examples=EXAMPLES or examples,
        deadline=DEADLINE,
        derandomize=not SEED,
        database=None,  # nothing kept between runs: a case found is written down as a test
        # the world a test builds (a node runtime, its queues) is the test's, not an example's
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
        # one failure, shrunk to its smallest case, is what a red run shows
        report_multiple_bugs=False,
    )

    def apply(test: Any) -> Any:
        test = chosen(test)
        return seed(int(SEED))(test) if SEED.isdigit() else test

    return apply


# --- the tally -----------------------------------------------------------------------------
@dataclass
class Tally:
    """Cases run per entrance, by the status they were answered with."""

    statuses: dict[str, collections.Counter[int]] = field(default_factory=dict)

    def record(self, entrance: str, status: int) -> None:
        self.statuses.setdefault(entrance, collections.Counter())[status] += 1

    def lines(self) -> list[str]:
        out = []
        for entrance, counts in sorted(self.statuses.items()):
            total = sum(counts.values())
            by_class = collections.Counter(f"{s // 100}xx" for s in counts.elements())
            server = sum(n for s, n in counts.items() if s >= 500)
            shown = ", ".join(f"{k} {v}" for k, v in sorted(by_class.items()))
            out.append(f"{entrance}: {total} cases ({shown}); 5xx: {server}")
        return out


TALLY = Tally()


def record(entrance: str, status: int, what: str = "") -> None:
    """Count one case of ``entrance`` answered with ``status`` (``what``: the call, for the log)."""
    TALLY.record(entrance, status)
    if LOG:
        with open(LOG, "a", encoding="utf-8", errors="backslashreplace") as log:
            log.write(f"{entrance} {status} {what[:300]!r}\n")


def server_error(status: int, headers: Callable[[str], str | None], *, outage: bool = False) -> str | None:
    """Why an answer is a server error (a bug), else None: any 5xx but a 503 with Retry-After,
    the answer to an outage. ``outage``: whether one may happen where the case runs; in this
    process, with the stores up, none does, and a 503 is a bug too (bad input taken for an
    outage: a client would retry it forever)."""
    if status < 500:
        return None
    if status == 503 and headers("Retry-After") and outage:
        return None
    if status == 503:
        return "503 with no outage" if headers("Retry-After") else "503 without Retry-After"
    return f"{status} is a server error"


# --- values -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Raw:
    """JSON text sent as it is where a value goes (:func:`dumps`): what ``json.dumps`` cannot
    write (an integer past Python's digit limit, nesting past its recursion) or refuses to."""

    text: str

    def __str__(self) -> str:  # what a form carries
        return self.text


#: A request without a body (where a value could be: ``replaced`` puts one there).
NO_BODY: Any = Raw("")


def dumps(value: Any) -> str:
    """``value`` as JSON text, :class:`Raw` parts as they are, NaN and the infinities as
    Python's ``json`` writes them, lone surrogates escaped (``\\ud800``)."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value)


def text_of(value: Any) -> str:
    """A scalar as a form or a query string carries it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict | list):
        return dumps(value)
    return str(value)


def deep_text(depth: int, kind: str = "[") -> str:
    """JSON text nested ``depth`` deep: arrays, or objects whose one key holds the next."""
    if kind == "[":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


_DIGITS = st.integers(4_301, 12_000)

NUMBERS: st.SearchStrategy[Any] = st.one_of(
    _DIGITS.map(lambda n: Raw("9" * n)),
    _DIGITS.map(lambda n: Raw("-" + "1" * n)),
    _DIGITS.map(lambda n: "9" * n),  # the same as text, which integer parameters also take
    st.sampled_from(
        [
            2**31,
            -(2**31) - 1,
            2**63,
            -(2**63) - 1,
            2**64,
            10**30,
            -1,
            -0.0,
            0.5,
            1.5,
            1e308,
            5e-324,
            -1e308,
            math.nan,
            math.inf,
            -math.inf,
            "²",
            "٣",
            "1e3",
            "0x10",
            "1_000",
            "+1",
            "-0",
            " 7 ",
            "0" * 40 + "1",
            "NaN",
            "Infinity",
            "1.0",
            "",
        ]
    ),
    st.integers(min_value=2**31),
    st.integers(max_value=-1),
    st.floats(allow_nan=True, allow_infinity=True),
)

NESTING: st.SearchStrategy[Any] = st.one_of(
    st.tuples(st.integers(17, 5_000), st.sampled_from("[{")).map(lambda t: Raw(deep_text(*t))),
    st.tuples(st.integers(17, 5_000), st.sampled_from("[{")).map(lambda t: deep_text(*t)),
    # JSON text nested deep, base64'd (what an opaque token such as a TaskHandle carries)
    st.integers(17, 5_000).map(lambda d: base64.b64encode(deep_text(d).encode()).decode()),
    # just past the bound a JSON body may nest (sqs.wire.MAX_DEPTH: 16), and just under it
    st.integers(14, 20).map(lambda d: Raw(deep_text(d, "{"))),
)

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False), st.text(max_size=8)
)
TYPES: st.SearchStrategy[Any] = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)

_CONTROL_CHARS = st.sampled_from(
    [chr(c) for c in range(0x20)]
    + ["\x7f", "\x85", "\u2028", "\u2029", "\ufeff", "\ufffe", "\uffff", "\ud800", "\udfff"]
)
CONTROL: st.SearchStrategy[Any] = st.lists(
    _CONTROL_CHARS | st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=24
).map("".join) | st.sampled_from(["\x00", "a\x00b", "\ud800", "line\r\nbreak", "\x1b[31m", "%00", "%"])

HUGE: st.SearchStrategy[Any] = st.one_of(
    st.tuples(st.sampled_from(["x", "é", "𝄞", "<", "%", "&", " "]), st.integers(1_025, 1 << 20)).map(
        lambda t: t[0] * t[1]
    ),
    st.integers(100, 2_000).map(lambda n: ["x"] * n),
    st.integers(100, 2_000).map(lambda n: {f"k{i}": "v" for i in range(n)}),
)

STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "numbers": NUMBERS,
    "nesting": NESTING,
    "types": TYPES,
    "control": CONTROL,
    "huge": HUGE,
}

#: Any hostile value, of any kind.
ANY_HOSTILE: st.SearchStrategy[Any] = st.one_of(*STRATEGIES.values())


def hostile(kind: str | None = None) -> st.SearchStrategy[Any]:
    """Hostile values of ``kind`` (one of :data:`KINDS`), or of any kind."""
    return ANY_HOSTILE if kind is None else STRATEGIES[kind]


# --- where to put them ------------------------------------------------------------------------
Path = tuple[Any, ...]


def paths(value: Any, prefix: Path = ()) -> list[Path]:
    """Every place in a JSON-ish value (keys of objects, indices of arrays), the value's own
    (``()``) first."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*prefix, i))
    return out


def replaced(value: Any, path: Path, new: Any) -> Any:
    """A copy of ``value`` with ``new`` at ``path`` (an object's missing key is added)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: replaced(value.get(head), rest, new)}
    if isinstance(value, list) and isinstance(head, int) and head < len(value):
        return [*value[:head], replaced(value[head], rest, new), *value[head + 1 :]]
    return {head: replaced(None, rest, new)}
