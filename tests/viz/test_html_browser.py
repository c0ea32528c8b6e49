"""The graph page in a real headless browser (Debian's chromium + chromedriver, driven by
selenium): the page of a compiled 4-layer decoder loads from a file:// URL without
script errors, a screenshot is a non-blank PNG, and the DOM holds what the compiled graph
says it should (oracles read from the compiled graph and its buffer plan, not from the
page generator): one node element per drawn node, the input names, one legend entry per
fusion group, one memory bar per owned working buffer; clicking a collapsed block shows
its nodes and clicking its header hides them again; the search box finds a node by name
and opens its block; clicking a memory bar selects its node.

Without chromium / chromedriver / selenium the test is skipped, except under CI
(``CI=true``), where it fails and says what to install.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlx.ops.core import Constant, Param

_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1000",
)
_INSTALL = (
    "the HTML graph view test needs Debian's chromium and chromium-driver "
    "(apt-get install chromium chromium-driver) and selenium (the test extra)"
)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _browser() -> tuple[str, str]:
    """Paths of chromium and chromedriver; fails under CI, else skips, when missing."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    missing = [n for n, p in (("chromium", chromium), ("chromedriver", driver)) if p is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium")
    if missing:
        msg = f"{', '.join(missing)} not found: {_INSTALL}"
        if _in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    assert chromium is not None and driver is not None
    return chromium, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver_path = _browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in _FLAGS:
        opts.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="rlx-chromium-")
    opts.add_argument(f"--user-data-dir={profile}")
    drv = webdriver.Chrome(service=Service(driver_path), options=opts)
    drv.set_page_load_timeout(20)
    try:
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _png_is_not_blank(path: Path, width: int) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    assert ihdr is not None and ihdr[0] == width and ihdr[1] > 200
    raw = zlib.decompress(idat)
    # a blank page is one colour: its filtered rows are almost all 0x00 / 0xff bytes
    varied = sum(1 for b in raw[::7] if b not in (0, 255)) / len(raw[::7])
    assert varied > 0.02 and len(set(raw)) > 64


def _owned_working(plan: Any) -> int:
    return sum(
        1
        for s in plan.slots.values()
        if s.view_of is None
        and s.inplace_of is None
        and s.offset >= plan.persistent_bytes
        and s.nbytes > 0
    )


def test_a_missing_browser_fails_under_ci_and_skips_elsewhere(monkeypatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="apt-get install chromium chromium-driver"):
        _browser()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="chromium, chromedriver not found"):
        _browser()


@pytest.mark.slow
def test_compiled_page_in_chromium(browser: Any, decoder_compiled: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    c = decoder_compiled
    page = tmp_path / "decoder.html"
    c.to_html(page, expand=False)
    browser.get(page.as_uri())
    WebDriverWait(browser, 10).until(
        lambda d: d.execute_script("return !!window.rlxView && document.readyState") == "complete"
    )
    shot = tmp_path / "decoder.png"
    assert browser.save_screenshot(str(shot))
    width = browser.execute_script("return window.innerWidth")
    _png_is_not_blank(shot, width)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []

    g, plan = c.graph, c.memory_plan
    hoisted = c.program.hoisted
    drawn = [
        n.id for n in g.nodes if not isinstance(n.op, (Param, Constant)) and n.id not in hoisted
    ]
    nodes = browser.find_elements(By.CSS_SELECTOR, "#graph g.node")
    assert sorted(int(e.get_attribute("data-id")) for e in nodes) == sorted(drawn)
    text = browser.find_element(By.ID, "graph").get_attribute("textContent")
    for name in c.input_names:
        assert name in text
    # the fusion legend: one entry per kind of fused kernel in the compiled graph
    want = {n.op.mnemonic for n in g.nodes if n.loc is not None and len(n.loc.fused) > 1}
    items = browser.find_elements(By.CSS_SELECTOR, "#legend-fusion li[data-group]")
    assert {e.get_attribute("data-group") for e in items} == want
    assert {"attention", "fused_swiglu"} <= want
    assert all(e.is_displayed() for e in items)
    # the memory timeline: one bar per owned buffer of the working region
    bars = browser.find_elements(By.CSS_SELECTOR, "#memory rect.buf")
    assert len(bars) == _owned_working(plan) > 10
    assert "peak" in browser.find_element(By.ID, "memory").get_attribute("textContent")

    # collapsed by default: a layer's nodes are hidden until its block is clicked
    block = browser.find_element(By.CSS_SELECTOR, 'g.block[data-block="layer1"]')
    inner = block.find_elements(By.CSS_SELECTOR, "g.node")
    assert inner and not any(e.is_displayed() for e in inner)
    block.find_element(By.CSS_SELECTOR, ".collapsed .block-box").click()
    assert all(e.is_displayed() for e in inner)
    browser.save_screenshot(str(tmp_path / "expanded.png"))
    block.find_element(By.CSS_SELECTOR, ".block-header .block-head-bg").click()
    assert not any(e.is_displayed() for e in inner)
    browser.find_element(By.ID, "expand-all").click()
    assert all(e.is_displayed() for e in nodes)
    browser.find_element(By.ID, "collapse-all").click()
    assert not any(e.is_displayed() for e in nodes)

    # search by name opens the block and marks the node; the details panel shows it
    browser.find_element(By.ID, "search").send_keys("rope_sin")
    WebDriverWait(browser, 5).until(lambda d: d.find_elements(By.CSS_SELECTOR, "g.node.hit"))
    hit = browser.find_element(By.CSS_SELECTOR, "g.node.hit")
    assert "rope_sin" in hit.get_attribute("data-name") and hit.is_displayed()
    assert "rope_sin" in browser.find_element(By.ID, "details").text
    assert browser.find_element(By.ID, "search-count").text == "1 match"

    # a memory bar selects the node that owns the buffer
    browser.find_element(By.ID, "collapse-all").click()
    bar = bars[len(bars) // 2]
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", bar)
    bar.click()
    owner = bar.get_attribute("data-node")
    sel = browser.find_element(By.CSS_SELECTOR, "g.node.selected")
    assert sel.get_attribute("data-id") == owner and sel.is_displayed()
    assert g.nodes[int(owner)].shape.dtype.value in browser.find_element(By.ID, "details").text
