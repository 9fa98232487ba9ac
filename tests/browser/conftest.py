"""Chromium for the HTML report tests: Debian's package (apt-get install chromium), driven by Playwright.

Every test here skips cleanly when Playwright or /usr/bin/chromium is missing;
``.ci/run`` installs both so CI always runs them. With
``TORCHLINT_UPDATE_SCREENSHOT=1`` the set-up also saves the README's
screenshot of the example run (docs/sanitizer-report.png).
"""
import json
import os
import pathlib
import sys

import pytest

CHROMIUM = os.environ.get("TORCHLINT_CHROMIUM", "/usr/bin/chromium")
ROOT = pathlib.Path(__file__).resolve().parents[2]
REPORTS = ROOT / "tests" / "sanitizer" / "data" / "reports"
SCREENSHOT = ROOT / "docs" / "sanitizer-report.png"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if pathlib.Path(str(item.fspath)).parent == pathlib.Path(__file__).parent:
            item.add_marker(pytest.mark.browser)
            # One Chromium at a time: keep these tests on one xdist worker.
            item.add_marker(pytest.mark.xdist_group("browser"))


# Module scope, never session: while Playwright's sync API is open, the worker's main thread has a
# running asyncio loop, and any later async test on the same xdist worker (the language server's,
# through pytest-asyncio) fails with "Runner.run() cannot be called from a running event loop".
@pytest.fixture(scope="module")
def chromium():
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no browser at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


class Page:
    """One loaded report page, with every console error and page error it raised."""

    def __init__(self, page):
        self.page = page
        self.errors = []
        page.on("console", lambda message: self.errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("request", lambda request: None if request.url.startswith(("file:", "data:", "about:"))
                else self.errors.append(f"network request: {request.url}"))


@pytest.fixture
def open_report(chromium, tmp_path):
    """``open_report(report, ...)``: render the reports to a file and load it in Chromium."""
    from torchlint.sanitizer.html_report import write_html

    pages = []

    def load(*reports, viewport=(1050, 1400)):
        path = tmp_path / f"report{len(pages)}.html"
        write_html(str(path), list(reports))
        page = chromium.new_page(viewport={"width": viewport[0], "height": viewport[1]})
        wrapped = Page(page)
        page.goto(path.as_uri())
        pages.append(page)
        return wrapped

    yield load
    for page in pages:
        page.close()


@pytest.fixture(scope="session")
def tour():
    return json.loads((REPORTS / "tour.json").read_text())


@pytest.fixture(scope="session")
def stepless():
    """A step-less script's report, made on the CPU by the real session and memory watcher."""
    sys.path.insert(0, str(ROOT / "tests" / "sanitizer"))
    try:
        from stepless_run import stepless_report
    finally:
        sys.path.remove(str(ROOT / "tests" / "sanitizer"))
    return stepless_report()


@pytest.fixture(scope="module", autouse=True)
def readme_screenshot(chromium, tour, tmp_path_factory):
    """The README's picture of the example run, saved when TORCHLINT_UPDATE_SCREENSHOT=1."""
    if os.environ.get("TORCHLINT_UPDATE_SCREENSHOT") == "1":
        from torchlint.sanitizer.html_report import write_html

        path = tmp_path_factory.mktemp("screenshot") / "tour.html"
        write_html(str(path), [tour])
        page = chromium.new_page(viewport={"width": 1050, "height": 1500})
        page.goto(path.as_uri())
        page.screenshot(path=str(SCREENSHOT))
        page.close()
    yield
