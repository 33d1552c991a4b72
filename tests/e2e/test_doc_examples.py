"""Every example of README.md and docs/**/*.md runs, in order, and shows what the text shows.

The pages (README.md, then docs/**/*.md in the order of the site's navigation, then by path)
are read for fenced blocks whose info string is ``console``, ``bash``, ``sh``, ``shell`` or
``python``; each page is one test, its blocks run in order in one ``bash`` of its own (so a variable one block sets, exported or not,
is there in the next), from the repository's root, against one node started as ``make run``
starts it: ``scripts/run.sh`` (the node and a Celery worker on the embedded defaults) with a
data folder of its own (``MQ_DATA_DIR``, also set in the pages' shell) on a free port, which
stands for ``127.0.0.1:8000`` wherever a block says it (in commands and in shown output). The
node is shared by the pages; README.md gets it new, and a page that holds the line
``<!-- example: fresh node -->`` gets a new one too (the old one stopped with Ctrl-C, which must
end ``scripts/run.sh`` with 0).

The pages' shell is what a newcomer has: the project's virtualenv is *not* on its ``PATH``
(``scripts/in-venv.sh`` is how a page reaches it), and none of the test run's service settings
(``DATABASE_URL``, ``KV_URL`` ...) are in its environment.

- ``console``: a line ``$ cmd`` is a command; the lines after it that start with ``> `` (or
  ``>`` alone) continue it (a here-document, a long line), as do lines after one that ends with
  ``\\``; the lines after those, up to the next ``$ ``, are its output, compared with what it
  prints (stdout and stderr) after masking, in both, what differs from run to run: message IDs
  (but their queue), receipts and receipt handles, tokens and keys, node IDs, times and dates.
  ``…`` in the shown output stands for any text. A command must exit 0.
- ``bash``, ``sh``, ``shell``: the block runs as one script in the page's shell; it must exit 0;
  what it prints is not checked.
- ``python``: the block runs with the project's virtualenv from the page's shell, read from standard
  input as a reader pastes it (``scripts/in-venv.sh python -``: the repository's root is on
  ``sys.path``); it must exit 0.
- A block preceded by the line ``<!-- example: not run: <reason> -->`` is skipped and counted.

Each command may take ``COMMAND_TIMEOUT`` seconds (``MQ_DOC_TIMES=1`` prints what each took, with
``-s``; ``MQ_DOC_TRANSCRIPT=<file>`` appends each console command and what it printed there). The summary at the end of the run says how many blocks ran and how many did not.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.launcher import ROOT

LANGUAGES = {"console", "bash", "sh", "shell", "python"}
NOT_RUN = re.compile(r"^\s*<!--\s*example:\s*not run:\s*(?P<reason>.+?)\s*-->\s*$")
FRESH = re.compile(r"^\s*<!--\s*example:\s*fresh node\s*-->\s*$", re.M)
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,})\s*(?P<info>[^`\s]*)[^`]*$")
#: The address the pages say; the test's node stands for it.
DOC_ADDRESS = "127.0.0.1:8000"
COMMAND_TIMEOUT = 120
#: Variables of the test run that a newcomer's shell does not have.
DROPPED_ENV = re.compile(
    r"^(VIRTUAL_ENV|DATABASE_URL|KV_URL|REDIS_URL|REDIS_CLUSTER_URL|CELERY_.*|DJANGO_.*|MQ_(?!VENV$|PYTHON$).*"
    r"|PYTEST_.*|PYTHONPATH|METRICS_.*|API_.*|CLUSTER_.*|NODE_.*|SQS_.*|WORKER_.*|QUEUE_API_.*|AWS_.*|PROMETHEUS_.*)$"
)

#: What differs between runs, masked in shown and printed output alike (most specific first).
MASKS = [
    (re.compile(r"([A-Za-z0-9_-]+)/\d+/[0-9a-f]{8}-[0-9a-f]{16}/\d+"), r"\1/<message-id>"),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{16}"), "<block>"),
    (re.compile(r'("(?:receipt|ReceiptHandle)"\s*:\s*)"[^"]*"'), r'\1"<receipt>"'),
    (re.compile(r"\bAKMQ[A-Z0-9]+"), "<key-id>"),
    (re.compile(r"(aws_secret_access_key = )\S+"), r"\1<secret>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"\b[0-9a-f]{32,40}\b"), "<hex>"),
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:?\d\d)?"), "<time>"),
    (re.compile(r"\b1\d{9}(?:\.\d+)?\b"), "<epoch>"),
]


@dataclass
class Block:
    page: str
    line: int
    language: str
    text: str
    not_run: str = ""


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)
    fresh: bool = False

    @property
    def name(self) -> str:
        return self.path.relative_to(ROOT).as_posix()


def read_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown page with their language and not-run reason."""
    name = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not re.match(rf"^\s*{fence}`*\s*$", lines[i]):
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1  # the closing fence
        if info not in LANGUAGES:
            continue
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = NOT_RUN.match(lines[before]) if before >= 0 else None
        blocks.append(Block(name, start + 1, info, "\n".join(body), marker["reason"] if marker else ""))
    return blocks


def reading_order() -> list[Path]:
    """README.md, the site's pages in the order of its navigation (mkdocs.yml), then any other
    page under docs/ by path."""
    nav: list[Path] = []
    mkdocs = ROOT / "mkdocs.yml"
    if mkdocs.is_file():
        for m in re.finditer(r"^\s*-\s*(?:[^\n:]*:\s*)?([\w./-]+\.md)\s*$", mkdocs.read_text(), re.M):
            nav.append(ROOT / "docs" / m[1])
    rest = [p for p in sorted((ROOT / "docs").rglob("*.md")) if p not in nav]
    return [ROOT / "README.md", *nav, *rest]


def pages() -> list[Page]:
    paths = reading_order()
    out = []
    for path in paths:
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            out.append(Page(path, read_blocks(path), fresh=bool(FRESH.search(text))))
    return out


PAGES = pages()
#: page -> (blocks to run, blocks marked not run), for the run's summary (tests/e2e/conftest.py).
COUNTS: dict[str, tuple[int, int]] = {}


# -------------------------------------------------------------------------------- console blocks


@dataclass
class Command:
    line: int
    text: str
    shown: str


def console_commands(block: Block) -> list[Command]:
    """A console block's commands and the output shown after each."""
    out: list[Command] = []
    lines = block.text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            if line.strip():
                raise AssertionError(f"{block.page}:{block.line + 1 + i}: output before any command: {line!r}")
            i += 1
            continue
        start = i
        command = [line[2:]]
        i += 1
        while i < len(lines):
            if command[-1].endswith("\\") or lines[i] == ">" or lines[i].startswith("> "):
                nxt = lines[i]
                command.append(nxt[2:] if nxt.startswith("> ") else "" if nxt == ">" else nxt)
                i += 1
            else:
                break
        shown: list[str] = []
        while i < len(lines) and not lines[i].startswith("$ "):
            shown.append(lines[i])
            i += 1
        out.append(Command(block.line + 1 + start, "\n".join(command), "\n".join(shown)))
    return out


def mask(text: str) -> str:
    for pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    return text


def normalized(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").split("\n")).strip()


def matches(shown: str, printed: str) -> bool:
    """Whether the printed output is the shown one, masked alike, ``…`` standing for any text."""
    want, got = normalized(mask(shown)), normalized(mask(printed))
    pattern = ".*?".join(re.escape(part) for part in want.split("…"))
    return re.fullmatch(pattern, got, re.S) is not None


# ------------------------------------------------------------------------------------ the node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def newcomer_env(data_dir: Path) -> dict[str, str]:
    """The environment of a newcomer's shell: no virtualenv on PATH, none of the test run's
    service settings; the node's data folder."""
    venv_bin = os.path.abspath(os.path.join(sys.prefix, "bin"))
    env = {k: v for k, v in os.environ.items() if not DROPPED_ENV.match(k)}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and os.path.abspath(p) != venv_bin
    )
    env["MQ_DATA_DIR"] = str(data_dir)
    env["LC_ALL"] = env["LANG"] = "C.UTF-8"
    return env


class MakeRun:
    """``scripts/run.sh`` (what ``make run`` runs) on a free port, in a process group of its own."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.data_dir = base
        self.log = base / "run.log"
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        self.port = free_port()
        self.data_dir = self.base / f"data-{self.starts}"
        self.data_dir.mkdir()
        self.log = self.base / f"run-{self.starts}.log"
        env = newcomer_env(self.data_dir) | {"PORT": str(self.port)}
        with open(self.log, "wb") as out:
            # SIGINT as a terminal's shell leaves it: a suite started in the background of a
            # script has it ignored, and bash started with SIGINT ignored cannot trap Ctrl-C.
            self.proc = subprocess.Popen(
                ["env", "--default-signal=INT", "scripts/run.sh"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"scripts/run.sh ended with {self.proc.returncode}:\n{self.tail()}")
            if self._ready():
                return
            time.sleep(0.3)
        raise AssertionError(f"no node within 180 s:\n{self.tail()}")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> int:
        """Ctrl-C, as a terminal sends it (to the whole process group); the script's exit code."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            return -9
        finally:
            self.proc = None

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="module")
def make_run():
    with tempfile.TemporaryDirectory(prefix="mq-doc-examples-") as base:
        run = MakeRun(Path(base))
        yield run
        if run.proc is not None:
            rc = run.stop()
            assert rc == 0, f"scripts/run.sh ended with {rc} after Ctrl-C:\n{run.tail()}"


# ------------------------------------------------------------------------------ a page's shell


class Shell:
    """One ``bash`` for a page: commands are written to files and sourced, so they read no
    input meant for the shell and their variables stay for the next."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.workdir = workdir
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.n = 0

    def run(self, script: str, timeout: float = COMMAND_TIMEOUT) -> tuple[int, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.n += 1
        path = self.workdir / f"command-{self.n}.sh"
        path.write_text(script + "\n")
        end = f"__end_of_command_{self.n}__"
        # printf's arguments are expanded before it runs: $? is the command's status, not an echo's
        self.proc.stdin.write(
            f"source {shlex.quote(str(path))} < /dev/null 2>&1; printf '\\n%s %s\\n' {end} $?\n".encode()
        )
        self.proc.stdin.flush()
        out: list[str] = []
        deadline = time.monotonic() + timeout
        os.set_blocking(self.proc.stdout.fileno(), False)
        buffer = b""
        while True:
            chunk = self.proc.stdout.read()
            if chunk:
                buffer += chunk
                text = buffer.decode(errors="replace")
                m = re.search(rf"\n{end} (\d+)\n", text)
                if m:
                    out.append(text[: m.start()])
                    return int(m[1]), "".join(out)
            elif self.proc.poll() is not None:
                return -1, buffer.decode(errors="replace") + "\n(the page's shell ended)"
            if time.monotonic() > deadline:
                return -2, buffer.decode(errors="replace") + f"\n(no end after {timeout:.0f} s)"
            time.sleep(0.05)

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


def on_port(text: str, port: int) -> str:
    return text.replace(DOC_ADDRESS, f"127.0.0.1:{port}")


def run_page(page: Page, make_run: MakeRun, tmp_path: Path) -> None:
    runnable = [b for b in page.blocks if not b.not_run]
    COUNTS[page.name] = (len(runnable), len(page.blocks) - len(runnable))
    if runnable and (make_run.proc is None or page.fresh):
        if make_run.proc is not None:
            rc = make_run.stop()
            assert rc == 0, f"scripts/run.sh ended with {rc} after Ctrl-C:\n{make_run.tail()}"
        make_run.start()
    if not runnable:
        return
    port = make_run.port
    shell = Shell(newcomer_env(make_run.data_dir), tmp_path)
    try:
        for block in runnable:
            where = f"{page.name}:{block.line}"
            if block.language == "console":
                for command in console_commands(block):
                    started = time.monotonic()
                    rc, printed = shell.run(on_port(command.text, port))
                    if os.environ.get("MQ_DOC_TIMES"):
                        print(f"{time.monotonic() - started:6.2f}s  {command.text[:100]!r}")
                    if os.environ.get("MQ_DOC_TRANSCRIPT"):
                        with open(os.environ["MQ_DOC_TRANSCRIPT"], "a") as transcript:
                            shown = "\n".join(
                                ("$ " if i == 0 else "> ") + t for i, t in enumerate(command.text.split("\n"))
                            )
                            transcript.write(f"{shown}\n{printed.rstrip()}\n" if printed.strip() else f"{shown}\n")
                    at = f"{page.name}:{command.line}: $ {command.text}"
                    assert rc == 0, f"{at}\nexited {rc}:\n{printed}\nnode:\n{make_run.tail()}"
                    assert matches(on_port(command.shown, port), printed), (
                        f"{at}\nshown:\n{command.shown}\nprinted:\n{printed}"
                        f"\n(masked, shown:)\n{mask(command.shown)}\n(masked, printed:)\n{mask(printed)}"
                    )
            elif block.language == "python":
                script = tmp_path / f"block-{block.line}.py"
                script.write_text(on_port(block.text, port) + "\n")
                rc, printed = shell.run(f"scripts/in-venv.sh python - < {shlex.quote(str(script))}")
                assert rc == 0, f"{where} (python) exited {rc}:\n{printed}"
            else:
                rc, printed = shell.run(on_port(block.text, port))
                assert rc == 0, f"{where} ({block.language}) exited {rc}:\n{printed}"
    finally:
        shell.close()


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_the_page_s_examples_run_as_shown(page, make_run, tmp_path):
    run_page(page, make_run, tmp_path)


def test_the_readme_s_session_covers_rest_sqs_and_a_worker_through_the_virtualenv():
    """The README's session (run above) has the three parts; Django is reached through the
    virtualenv only, as the pages' shell has no other way to it."""
    readme = PAGES[0]
    assert readme.name == "README.md"
    commands = [c.text for b in readme.blocks if b.language == "console" for c in console_commands(b)]
    assert any("/dequeue" in c for c in commands)
    assert any("boto3" in c for c in commands)
    assert any("WORKER_HANDLERS" in c for c in commands)
    bare = [c for c in commands if re.search(r"(^|[;&|(]\s*)python3? manage\.py", c)]
    assert not bare, bare


def test_a_console_block_reads_as_commands_continuations_and_shown_output(tmp_path):
    # given a page with a marked block, an indented block and a console block
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- example: not run: needs a cluster -->\n\n```bash\nmake cluster\n```\n"
        "- item\n\n    ```console\n    $ echo a \\\n      b\n    a b\n    $ cat <<EOF\n    > x\n    >\n    > EOF\n"
        "    x\n\n    ```\n```text\nnot an example\n```\n"
    )

    # when it is read
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys.modules[__name__], "ROOT", tmp_path)
        blocks = read_blocks(page)

    # then the text block is left out, the marked one carries its reason, the console one parses
    assert [(b.language, b.not_run) for b in blocks] == [("bash", "needs a cluster"), ("console", "")]
    commands = console_commands(blocks[1])
    assert [(c.text, c.shown.strip()) for c in commands] == [("echo a \\\n  b", "a b"), ("cat <<EOF\nx\n\nEOF", "x")]


def test_shown_output_matches_with_masks_and_ellipses():
    printed = '{"id":"orders/1/00000000-0123456789abcdef/0","receipt":"Zv_9","at":"2026-11-27T07:41:36.160826Z","n":2}'
    shown = '{"id":"orders/3/00000000-bc326889c6bb59bb/2","receipt":"h9Zu","at":"2026-01-01T00:00:00Z",…}'
    assert matches(shown, printed)
    assert not matches(shown.replace("orders", "other"), printed)
    assert not matches('{"acked":1,"not_found":0}', '{"acked":0,"not_found":1}')
