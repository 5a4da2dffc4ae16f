"""The built documentation site in a real browser: the index and one API page open, and no link is broken.

Headless Chromium (Debian's ``/usr/bin/chromium``, ``$VITVIZ_CHROMIUM``) driven by Playwright opens the pages
of ``make docs`` (``$VITVIZ_DOCS_HTML``, default ``docs/_build/html``) from ``file://`` URLs. On each page every
local ``href`` and ``src`` (links, images, style sheets, scripts) must resolve to a file of the site, every
in-page ``#fragment`` to an element id, and no request may fail; a page that links outside the site loads
nothing from there (the site works offline). ``make test-browser`` builds the site and runs this.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest
from conftest import skip_or_fail

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("VITVIZ_DOCS_HTML", ROOT / "docs" / "_build" / "html")).resolve()
CHROMIUM = os.environ.get("VITVIZ_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--allow-file-access-from-files"]
API_PAGE = "generated/vitviz.plot_pos_embed.html"


def _missing() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (make install-browser)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM} (make install-browser, or set VITVIZ_CHROMIUM)"
    if not (SITE / "index.html").is_file():
        return f"no documentation site at {SITE} (make docs)"
    return None


@pytest.fixture(scope="module")
def browser():
    skip_or_fail(_missing())
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield chromium
        finally:
            chromium.close()


def broken_links(page_url: str, urls: list[str], ids: set[str]) -> list[str]:
    """The local ``urls`` of the page at ``page_url`` that name no file of the site, or no id of the page."""
    broken = []
    for url in urls:
        target, fragment = urldefrag(url)
        parsed = urlparse(target)
        if parsed.scheme in ("http", "https", "mailto", "data", "javascript"):
            continue
        if parsed.scheme != "file":
            broken.append(f"{url} (not a file URL)")
            continue
        path = Path(unquote(parsed.path))
        if not path.exists():
            broken.append(f"{url} (no file {path})")
        elif not path.resolve().is_relative_to(SITE):
            broken.append(f"{url} (outside the site)")
        elif path.is_dir() and not (path / "index.html").is_file():
            broken.append(f"{url} (a folder without index.html)")
        elif fragment and target == urldefrag(page_url)[0] and fragment not in ids:
            broken.append(f"{url} (no element id {fragment!r} on the page)")
    return broken


def check_page(browser, rel: str) -> tuple[str, int]:
    page = browser.new_page()
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))
    external: list[str] = []
    page.on("request", lambda r: external.append(r.url) if r.url.startswith(("http:", "https:")) else None)
    try:
        url = (SITE / rel).as_uri()
        response = page.goto(url, wait_until="load", timeout=60_000)
        assert response is None or response.ok, f"{rel}: {response and response.status}"
        title = page.title()
        urls = page.eval_on_selector_all(
            "a[href], link[href], img[src], script[src]",
            "els => els.map(e => e.href || e.src).filter(u => typeof u === 'string' && u.length > 0)")
        ids = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
        broken = broken_links(url, urls, ids)
        assert not broken, f"{rel}: broken links:\n" + "\n".join(broken)
        assert not failed, f"{rel}: failed requests:\n" + "\n".join(failed)
        assert not external, f"{rel}: loaded from the network: {external}"
        return title, len(urls)
    finally:
        page.close()


def test_index_opens_and_no_link_is_broken(browser):
    title, n = check_page(browser, "index.html")
    assert "vitviz" in title and n > 20


def test_an_api_page_opens_and_no_link_is_broken(browser):
    title, n = check_page(browser, API_PAGE)
    assert "plot_pos_embed" in title and n > 20
    page = browser.new_page()
    try:
        page.goto((SITE / API_PAGE).as_uri())
        assert page.locator("dt.sig").count() >= 1  # the signature autodoc rendered
        assert "Returns" in page.inner_text("main")
    finally:
        page.close()


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = (SITE / "index.html").as_uri()
    urls = [page + "#top", (SITE / "no-such-page.html").as_uri(), "https://example.org/", page + "#no-such-id"]
    assert broken_links(page, urls, {"top"}) == [f"{urls[1]} (no file {SITE / 'no-such-page.html'})",
                                                  f"{urls[3]} (no element id 'no-such-id' on the page)"]
