"""The cache inspector's /dashboard under a shared-prefix chat load, in headless Chromium: the
README's screenshot (docs/img/dashboard.png), and the browser test's helpers.

    radixserve serve --cache-inspector-text --port 30000 &
    .venv/bin/python -m benchmarks.dashboard_screenshot --url http://127.0.0.1:30000 --out docs/img/dashboard.png

It opens /dashboard first (the page keeps its own history for the charts), sends chat requests
from four "apps", each with its own system prompt, for ``--seconds``, and a few seconds before
the load ends (so running requests and locked nodes show) waits until the page shows the tree
and a non-zero hit rate and saves a screenshot of the whole page.  Chromium is
Debian's ``chromium`` + ``chromium-driver`` (``make install`` installs them), driven by
Selenium through the system chromedriver; nothing is downloaded.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import httpx

APPS = {
    "You are the help desk of the Riverside public library. Answer questions about opening hours, "
    "loans, renewals and events in one or two friendly sentences. If you do not know, say so.": [
        "When are you open on Sundays?", "How many books can I borrow at once?", "Can I renew a loan online?",
        "Is there a chess club for kids?", "Do you lend e-readers?", "What happens if I return a book late?"],
    "You are a senior Python reviewer. Point out the most important problem in the code the user "
    "shows, explain why it matters, and suggest a fix. Be concise and concrete.": [
        "def add(items=[]): items.append(1); return items", "for i in range(len(xs)): print(xs[i])",
        "except Exception: pass", "open('f.txt').read()", "if x == None: return"],
    "You are a travel planner. Given a city and a number of days, suggest a short itinerary with one "
    "highlight per day and a local dish to try. Keep it under 80 words.": [
        "Lisbon, 2 days", "Kyoto, 3 days", "Mexico City, 2 days", "Edinburgh, 1 day", "Istanbul, 3 days"],
    "You translate English questions into SQL for a shop database with tables customers(id, name, "
    "city), orders(id, customer_id, total, created_at) and items(order_id, sku, qty). Reply with SQL only.": [
        "How many customers live in Paris?", "Total revenue per month in 2024", "Top 5 customers by spend",
        "Orders with more than three items", "Customers who never ordered"],
}

_PAGE_STATE = """
const q = (s) => document.querySelectorAll(s);
return {hit: document.getElementById('hit-rate-value').textContent,
        status: document.getElementById('status-text').textContent,
        rows: q('#tree-view .tree-row').length, rects: q('#icicle rect.node').length,
        key_form: getComputedStyle(document.getElementById('key-form')).display !== 'none', url: location.href,
        height: document.documentElement.scrollHeight};
"""


def chromium_driver(width: int = 1440, height: int = 1000):
    """Headless Debian Chromium through the system chromedriver (Selenium Manager stays offline)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager fetch a browser or driver
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if browser is None or not os.path.exists(driver_path):
        raise RuntimeError("chromium / chromedriver missing: run `make install` (Debian packages chromium, "
                           "chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    profile = tempfile.mkdtemp(prefix="rs-chromium-")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                "--force-device-scale-factor=1", "--no-first-run", "--disable-extensions", "--disable-sync",
                "--disable-background-networking", "--disable-component-update", "--disable-default-apps",
                f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    driver.set_page_load_timeout(60)
    driver.rs_profile = profile
    return driver


def close_driver(driver) -> None:
    try:
        driver.quit()
    finally:
        shutil.rmtree(getattr(driver, "rs_profile", ""), ignore_errors=True)


def page_state(driver) -> dict[str, Any]:
    return driver.execute_script(_PAGE_STATE)


def hit_percent(text: str) -> Optional[float]:
    return float(text.rstrip("%")) if text.endswith("%") else None


def wait_rendered(driver, timeout: float = 90.0, min_rows: int = 2) -> dict[str, Any]:
    """The page's state once the tree (rows and icicle) and a non-zero hit rate show; raises
    TimeoutError with the last state otherwise."""
    deadline, state = time.time() + timeout, {}
    while time.time() < deadline:
        state = page_state(driver)
        hit = hit_percent(state["hit"])
        if hit and hit > 0 and state["rows"] >= min_rows and state["rects"] >= min_rows:
            return state
        time.sleep(0.5)
    raise TimeoutError(f"dashboard not rendered after {timeout}s: {state}")


def screenshot(driver, path: str, width: int = 1440) -> None:
    """The whole page: the viewport is set to the page's size first (DevTools' device metrics,
    so no window decoration is counted)."""
    height = min(4000, page_state(driver)["height"])
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    time.sleep(1.5)  # a resize redraws the charts and the icicle
    height = min(4000, page_state(driver)["height"])
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    time.sleep(0.5)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    driver.save_screenshot(path)


def send_load(url: str, key: Optional[str], seconds: float, concurrency: int = 4, max_requests: int = 400,
              max_tokens: int = 24, seed: int = 0) -> dict[str, int]:
    """Chat requests from ``APPS`` for ``seconds`` (at most ``max_requests``); returns the
    usage summed over them."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    deadline, lock = time.time() + seconds, threading.Lock()
    totals = {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0, "errors": 0}
    rnd, started = random.Random(seed), [0]
    apps = list(APPS.items())
    weights = [8, 4, 2, 1]  # a realistic skew: one busy app, a long tail

    def worker(_: int) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=120) as c:
            while time.time() < deadline:
                with lock:
                    if started[0] >= max_requests:
                        return
                    started[0] += 1
                    system, questions = rnd.choices(apps, weights)[0]
                    question = rnd.choice(questions)
                r = c.post("/v1/chat/completions", json={
                    "model": "default", "max_tokens": max_tokens, "temperature": 0.7,
                    "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]})
                with lock:
                    if r.status_code != 200:
                        totals["errors"] += 1
                        continue
                    u = r.json()["usage"]
                    totals["requests"] += 1
                    totals["prompt_tokens"] += u["prompt_tokens"]
                    totals["cached_tokens"] += (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--key", default=None, help="admin API key, if the server has keys")
    ap.add_argument("--out", default="docs/img/dashboard.png")
    ap.add_argument("--seconds", type=float, default=75.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-requests", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    driver = chromium_driver()
    try:
        driver.get(args.url + "/dashboard" + (f"#key={args.key}" if args.key else ""))
        t0, totals = time.time(), {}
        loader = threading.Thread(target=lambda: totals.update(
            send_load(args.url, args.key, args.seconds, args.concurrency, args.max_requests, args.max_tokens)))
        loader.start()
        time.sleep(max(0.0, args.seconds - 6))  # the picture is taken under load: running requests, locks
        print("page:", wait_rendered(driver))
        screenshot(driver, args.out)
        loader.join()
        print(f"saved {args.out}; load: {totals} in {time.time() - t0:.1f}s "
              f"(client-side hit rate {totals['cached_tokens'] / max(1, totals['prompt_tokens']):.1%})")
    finally:
        close_driver(driver)

if __name__ == "__main__":
    main()
