"""Browser tests: headless Chromium (Debian's ``chromium`` + ``chromium-driver``) driven by
Selenium against a real node process (``manage.py runnode``) on the test database.

Screenshots of every step go to ``artifacts/screenshots/<test name>/<nn>-<step>.png`` under
the repository root, or under ``$MQ_ARTIFACTS_DIR/screenshots/`` when that is set.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.integration.nodes import THIS_PROCESS
from tests.launcher import ROOT

CHROMIUM = os.environ.get("MQ_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("MQ_CHROMEDRIVER", "/usr/bin/chromedriver")
ADMIN_USER, ADMIN_PASSWORD = "operator", "e2e-Secret-pw-1"


def _missing_browser() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{path} not found (apt-get install chromium chromium-driver; scripts/services.sh start does it)"
    return None


def artifacts_dir() -> Path:
    return Path(os.environ.get("MQ_ARTIFACTS_DIR") or ROOT / "artifacts")


@pytest.fixture(scope="session")
def chromium_paths():
    reason = _missing_browser()
    if reason:
        pytest.skip(f"no browser: {reason}")
    return CHROMIUM, CHROMEDRIVER


@pytest.fixture(scope="session")
def _driver(chromium_paths, tmp_path_factory):
    """One headless Chromium for the session; each test gets it with its cookies cleared."""
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never try to download a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = chromium_paths
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path_factory.getbasetemp())
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    # the page's console messages, for tests that check a page logs no error (driver.get_log("browser"))
    options.set_capability("goog:loggingPrefs", {"browser": "SEVERE"})
    log = tmp_path_factory.getbasetemp() / "chromedriver.log"
    driver = webdriver.Chrome(service=Service(chromedriver, log_output=str(log)), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


class Screenshots:
    """Numbered full-page PNGs of one test's steps."""

    def __init__(self, driver, folder: Path):
        self.driver, self.folder, self.count = driver, folder, 0
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)

    def __call__(self, step: str) -> Path:
        self.count += 1
        path = self.folder / f"{self.count:02d}-{re.sub(r'[^a-z0-9]+', '-', step.lower()).strip('-')}.png"
        # The whole page, not just the window: grow the window to the document for the shot,
        # then give the window its size back (a test may be checking a layout at that size).
        before = self.driver.get_window_size()
        height = self.driver.execute_script(
            "return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)"
        )
        width = self.driver.execute_script(
            "return Math.max(document.body.scrollWidth, document.documentElement.scrollWidth)"
        )
        self.driver.set_window_size(
            max(before["width"], min(int(width), 4000)), max(before["height"], min(int(height) + 140, 6000))
        )
        try:
            assert self.driver.save_screenshot(str(path)), f"could not save {path}"
        finally:
            self.driver.set_window_size(before["width"], before["height"])
        return path


def pytest_collection_modifyitems(items):
    """The node of a browser test (``node``, tests/conftest.py) shares this process's key-value
    store, so the test reads what the node wrote, and runs with ``DEBUG=0``; its own
    ``@pytest.mark.node(env=...)`` adds settings."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.node(backend=THIS_PROCESS, env={"DEBUG": "0"}))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"report_{report.when}", report)  # for the fixtures' teardown: did it fail?
    return report


@pytest.fixture
def browser(_driver, request):
    """The browser, and ``browser.shot(step)`` saving a screenshot for this test. When the
    test fails, the page it was on is saved too (screenshot and HTML)."""
    _driver.delete_all_cookies()
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    shots = Screenshots(_driver, artifacts_dir() / "screenshots" / name)
    _driver.shot = shots
    yield _driver
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        try:
            shots("failed here")
            (shots.folder / "failed-here.html").write_text(_driver.page_source)
        except Exception as exc:  # noqa: BLE001 - the browser itself may be what broke
            print(f"could not save the page the test failed on: {exc}")
        shots.folder.mkdir(parents=True, exist_ok=True)
        for node in getattr(request.node, "started_nodes", ()):  # (node_factory's, stopped by now)
            if node.log_path.exists():
                shutil.copy(node.log_path, shots.folder / node.log_path.name)


@pytest.fixture
def admin_login(transactional_db):
    """A committed superuser with a password; returns (username, password)."""
    from django.contrib.auth.models import User

    User.objects.create_superuser(ADMIN_USER, "operator@example.com", ADMIN_PASSWORD)
    return ADMIN_USER, ADMIN_PASSWORD


def pytest_terminal_summary(terminalreporter):
    """How many documentation examples ran and how many are marked not run (test_doc_examples)."""
    import sys

    module = sys.modules.get("tests.e2e.test_doc_examples")
    counts = getattr(module, "COUNTS", None)
    if counts:
        ran = sum(r for r, _ in counts.values())
        skipped = sum(n for _, n in counts.values())
        terminalreporter.write_line(
            f"doc examples: {ran} blocks run, {skipped} not run, on {len(counts)} pages (run/not run:"
            f" {', '.join(f'{page} {r}/{n}' for page, (r, n) in counts.items() if r or n)})"
        )
