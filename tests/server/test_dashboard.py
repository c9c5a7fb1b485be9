"""The web dashboard in a real headless Chromium (Debian's chromium + chromium-driver, which
`make test` installs), driven by Selenium, against a real server."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from support import Raw, set_cmd
from tercel.testing import ServerProcess

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1100",
)
WAIT_S = 30.0
"""Upper bound of every wait for the page to show something (never a pass/fail timing)."""


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: webdriver.Chrome, what: str, check: Any) -> Any:
    return WebDriverWait(driver, WAIT_S).until(check, message=what)


def cell(driver: webdriver.Chrome, queue: str, key: str) -> str | None:
    found = driver.find_elements(By.CSS_SELECTOR, f'tr[data-queue="{queue}"] td[data-key="{key}"]')
    return found[0].text if found else None


def click(driver: webdriver.Chrome, queue: str, action: str) -> Any:
    """Click a row's action button; the confirmation dialog it opens."""
    selector = f'tr[data-queue="{queue}"] button[data-action="{action}"]'
    driver.find_element(By.CSS_SELECTOR, selector).click()
    return wait_for(driver, f"confirmation of {action}", lambda d: d.switch_to.alert)


def chart_last(driver: webdriver.Chrome, chart: str) -> Any:
    """The newest value of a chart's first series, as uPlot holds it."""
    script = f"const d = window.tercelDashboard.charts.{chart}.data; return d[1][d[1].length - 1];"
    return driver.execute_script(script)


def test_dashboard_shows_queues_live_and_flushes_after_a_confirmation(
    browser: webdriver.Chrome, tmp_path: Path
) -> None:
    config = '[server]\nadmin_token = "dash-board-token"\n'
    with ServerProcess(tmp_path / "data", config) as srv:
        raw = Raw(srv.connect())
        raw.call(set_cmd("other", b"o"), b"STORED\r\n")
        raw.call(b"get aaa\r\n", b"END\r\n")  # an empty queue, first by name
        browser.get(srv.admin_url + "/")
        wait_for(browser, "status badge", lambda d: d.find_element(By.ID, "status").text == "UP")
        wait_for(browser, "row of other", lambda d: cell(d, "other", "items") == "1")

        raw.call(set_cmd("jobs", b"x" * 1000) * 5, b"STORED\r\n" * 5)
        wait_for(browser, "row of jobs", lambda d: cell(d, "jobs", "items") == "5")
        assert cell(browser, "jobs", "bytes") == "4.88 KiB"
        wait_for(browser, "server depth chart", lambda d: chart_last(d, "serverDepth") == 6)
        # Before any click the charts show the largest queue (not "aaa", empty, first by name).
        title = browser.find_element(By.ID, "queue-depth-title")
        wait_for(browser, "largest queue charted", lambda d: title.text.startswith("jobs: "))
        assert "(the largest queue; click a row to choose)" in title.text
        wait_for(browser, "queue depth chart", lambda d: chart_last(d, "queueDepth") == 5)
        # A click picks a queue for good: the charts stay on it when another grows.
        browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="other"] td.name').click()
        assert title.text == "other: items waiting (15 min)"
        wait_for(browser, "picked queue charted", lambda d: chart_last(d, "queueDepth") == 1)
        browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="jobs"] td.name').click()
        wait_for(browser, "queue depth chart", lambda d: chart_last(d, "queueDepth") == 5)
        assert title.text == "jobs: items waiting (15 min)"
        head_age = browser.find_element(By.XPATH, '//th[text()="head age"]')
        assert "last-taken age" in (head_age.get_attribute("title") or "")  # the CLI's other figure

        # the search box narrows the table
        browser.find_element(By.ID, "search").send_keys("oth")
        wait_for(browser, "search", lambda d: cell(d, "jobs", "items") is None)
        assert cell(browser, "other", "items") == "1"
        browser.find_element(By.ID, "search").send_keys(Keys.BACKSPACE * 3)
        wait_for(browser, "search cleared", lambda d: cell(d, "jobs", "items") == "5")

        # Delete, then cancel the confirmation: nothing happens
        alert = click(browser, "jobs", "delete")
        assert 'Delete queue "jobs"?' in alert.text
        alert.dismiss()

        # Flush without the token: refused, and the page says why
        click(browser, "jobs", "flush").accept()
        error = browser.find_element(By.ID, "error")
        wait_for(browser, "refusal shown", lambda d: "admin token" in error.text)
        assert cell(browser, "jobs", "items") == "5"

        # Flush with the token, accept: the row empties, and memcache agrees
        browser.find_element(By.ID, "token").send_keys("dash-board-token", Keys.TAB)
        alert = click(browser, "jobs", "flush")
        assert 'Flush queue "jobs"?' in alert.text
        alert.accept()
        wait_for(browser, "flushed row", lambda d: cell(d, "jobs", "items") == "0")
        raw.call(b"get jobs\r\n", b"END\r\n")
        wait_for(browser, "queue chart after flush", lambda d: chart_last(d, "queueDepth") == 0)
        assert browser.find_element(By.ID, "error").get_attribute("hidden") is not None
        logged = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert len(logged) == 1 and "401" in logged[0]  # the refused flush, nothing else

        # every request the page made went to the admin port
        urls = browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)"
        )
        assert urls and all(u.startswith(srv.admin_url + "/") for u in urls), urls

        # TERCEL_DASHBOARD_SHOT=path keeps the screenshot where a person can look at it
        shot = Path(os.environ.get("TERCEL_DASHBOARD_SHOT", tmp_path / "dashboard.png"))
        assert browser.save_screenshot(str(shot))
        with Image.open(shot) as img:
            assert img.size[0] >= 1000 and img.size[1] >= 800
            colors = img.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colors is not None and len(colors) > 50  # text, charts, badges: not blank
        most = max(count for count, _ in colors)
        assert most < 0.9 * img.size[0] * img.size[1]


def http(url: str, method: str = "GET") -> tuple[int, Any]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as exc:
        with exc:
            body = exc.read()
            is_json = exc.headers.get_content_type() == "application/json"
            return exc.code, json.loads(body) if is_json else body.decode()


def test_dashboard_json_history_and_actions(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", "[queues]\nsync_journal = true\n") as srv:
        raw = Raw(srv.connect())
        raw.call(set_cmd("jobs", b"abc") * 3 + set_cmd("other", b"x"), b"STORED\r\n" * 4)
        raw.call(b"get jobs/open\r\n", b"VALUE jobs/open 0 3\r\nabc\r\nEND\r\n")
        code, doc = http(srv.admin_url + "/dashboard.json?search=JOB")
        assert code == 200 and doc["matched"] == 1
        (row,) = doc["queues"]
        assert (row["name"], row["items"], row["bytes"], row["open_reads"]) == ("jobs", 2, 6, 1)
        server = doc["server"]
        assert (server["queues"], server["items"], server["status"]) == (2, 3, "UP")
        assert server["fsyncs"] > 0 and server["fsync_p99_us"] >= server["fsync_p50_us"]
        assert server["journal_bytes"] > 0
        assert http(srv.admin_url + "/dashboard.json?limit=1")[1]["queues"][0]["name"] == "jobs"
        assert http(srv.admin_url + "/dashboard.json?limit=x")[0] == 400
        code, past = http(srv.admin_url + "/history.json")
        assert code == 200 and len(past["t"]) == len(past["items"]) >= 1
        assert http(srv.admin_url + "/history.json?queue=nosuch")[1]["kept"] is False

        assert http(srv.admin_url + "/queues/other/flush", "POST")[0] == 200
        assert http(srv.admin_url + "/queues/nosuch/flush", "POST")[0] == 404
        assert http(srv.admin_url + "/queues/bad.name/delete", "POST")[0] == 400
        assert http(srv.admin_url + "/queues/other/flush")[0] == 405  # GET
        assert http(srv.admin_url + "/status/readonly", "POST")[0] == 200
        code, refused = http(srv.admin_url + "/queues/other/delete", "POST")
        assert code == 409 and "READONLY" in refused["error"]
        assert http(srv.admin_url + "/status/up", "POST")[0] == 200
        assert http(srv.admin_url + "/queues/other/delete", "POST")[0] == 200
        raw.call(b"dump_stats other\r\n", b"queue 'other' {\r\n}\r\nEND\r\n")
        assert not list(srv.data_dir.glob("other*"))


def test_dashboard_actions_need_the_admin_token_when_set(tmp_path: Path) -> None:
    token = "s3cret-token"
    with ServerProcess(tmp_path / "data", f'[server]\nadmin_token = "{token}"\n') as srv:
        Raw(srv.connect()).call(set_cmd("jobs", b"x"), b"STORED\r\n")
        url = srv.admin_url + "/queues/jobs/flush"
        assert http(url, "POST")[0] == 401
        assert http(srv.admin_url + "/dashboard.json")[1]["queues"][0]["items"] == 1  # GETs open
        request = urllib.request.Request(url, method="POST")
        request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=10) as res:
            assert res.status == 200
        assert http(srv.admin_url + "/dashboard.json")[1]["queues"][0]["items"] == 0
