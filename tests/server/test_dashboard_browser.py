"""/dashboard in headless Chromium (Debian's chromium + chromium-driver, Selenium through the
system chromedriver) against the shared tiny server with a warmed cache: the page takes the
admin key from the URL fragment (and drops it from the address), draws the tree (rows and
icicle) and a non-zero hit rate; without a key it asks for one.  The bounded version of
benchmarks/dashboard_screenshot.py, whose helpers it uses."""
from __future__ import annotations

import time

import pytest

from tests.helpers.server_harness import API_KEY

pytestmark = pytest.mark.usefixtures("kv_invariants")


@pytest.fixture(scope="module")
def shot():
    from benchmarks import dashboard_screenshot

    return dashboard_screenshot


@pytest.fixture
def driver(shot):
    d = shot.chromium_driver(1280, 900)
    yield d
    shot.close_driver(d)


def test_dashboard_shows_tree_and_hit_rate(server, shot, driver, tmp_path):
    driver.get(f"{server.url}/dashboard#key={API_KEY}")
    totals = shot.send_load(server.url, API_KEY, seconds=60, concurrency=2, max_requests=10, max_tokens=2)
    assert totals["requests"] == 10 and totals["errors"] == 0, totals
    assert totals["cached_tokens"] > 0, totals  # the apps' system prompts were shared
    state = shot.wait_rendered(driver, timeout=60)
    assert API_KEY not in state["url"] and state["url"].endswith("/dashboard"), state
    assert not state["key_form"] and state["status"].startswith("live"), state
    assert 0 < shot.hit_percent(state["hit"]) <= 100
    labels = driver.execute_script(
        "return Array.from(document.querySelectorAll('#tree-view .tree-row .label')).map(e => e.textContent)")
    assert labels[0].startswith("root") and all(" tok" in label for label in labels[1:]), labels
    note = driver.find_element("id", "privacy-note").text
    assert "previews are off" in note
    out = tmp_path / "dashboard.png"
    shot.screenshot(driver, str(out), width=1280)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def poll_state(shot, driver, cond, timeout: float = 30.0) -> dict:
    """The page's state once ``cond(state)`` holds (the last state otherwise)."""
    deadline = time.time() + timeout
    while True:
        state = shot.page_state(driver)
        if cond(state) or time.time() > deadline:
            return state
        time.sleep(0.3)


def test_dashboard_asks_for_the_key(server, shot, driver):
    driver.get(f"{server.url}/dashboard")
    state = poll_state(shot, driver, lambda s: s["key_form"])
    assert state["key_form"] and state["rows"] == 0 and state["hit"] == "—", state
    driver.find_element("id", "key-input").send_keys(API_KEY)
    driver.find_element("css selector", "#key-form button").click()
    state = poll_state(shot, driver, lambda s: s["rows"] >= 1 and s["status"].startswith("live"))
    assert state["rows"] >= 1 and not state["key_form"] and state["status"].startswith("live"), state
