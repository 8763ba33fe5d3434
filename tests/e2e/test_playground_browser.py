"""The playground page in a real headless browser (Debian's chromium, driven by its chromedriver,
which the test starts itself) against ``fastvideo3 serve --gateway-port`` (conftest.py).

The page loads and lists the fleet's card; a prompt submitted from the form plays a video (the
<video> element has data and its clock advances, or it ended) before the deadline; a bad size
shows the API's error message next to the size field.
"""
from __future__ import annotations

import shutil

import pytest

pytest.importorskip("selenium")
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

pytestmark = pytest.mark.timeout(360)  # the shared fleet may take two starts (gateway_stack.py)
PLAY_DEADLINE_S = 120.0


def _binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(f"none of {names} is installed (`make test` installs chromium and chromium-driver)")


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = _binary("chromium", "chromium-browser")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--mute-audio",
                "--autoplay-policy=no-user-gesture-required", "--window-size=1200,900"):
        options.add_argument(arg)
    service = Service(executable_path=_binary("chromedriver"))  # started (and stopped) by this test
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _open(browser, url: str) -> None:
    browser.get(url + "/")
    WebDriverWait(browser, 60).until(lambda d: [o.text for o in Select(d.find_element("id", "model")).options])


def _fill(browser, **fields: str) -> None:
    for name, value in fields.items():
        el = browser.find_element("id", name)
        el.clear()
        el.send_keys(value)


def test_page_loads_with_the_fleets_cards(browser, gateway_stack):
    _open(browser, gateway_stack.url)
    assert browser.title == "fastvideo3 playground"
    assert [o.text for o in Select(browser.find_element("id", "model")).options] == ["wan-tiny"]


def test_submitted_prompt_plays_a_video(browser, gateway_stack):
    _open(browser, gateway_stack.url)
    _fill(browser, prompt="a red circle moving left", size="64x64", frames="9", steps="2", seed="4")
    browser.find_element("id", "submit").click()

    def playing(d):
        state = d.execute_script(
            "const v = document.getElementById('player');"
            "return {ready: v.readyState, t: v.currentTime, ended: v.ended, err: v.error && v.error.code,"
            "        w: v.videoWidth, h: v.videoHeight, src: v.currentSrc};")
        assert state["err"] is None, f"the video element failed: {state}"
        return state if state["ready"] >= 2 and (state["t"] > 0 or state["ended"]) else False

    state = WebDriverWait(browser, PLAY_DEADLINE_S, poll_frequency=0.2).until(playing)
    assert (state["w"], state["h"]) == (64, 64), state
    assert "completed" in browser.find_element("id", "status").text
    # the job shows up in the recent jobs table
    WebDriverWait(browser, 30).until(lambda d: "completed" in d.find_element("id", "jobs").text)


def test_bad_size_shows_the_error_next_to_its_field(browser, gateway_stack):
    _open(browser, gateway_stack.url)
    _fill(browser, prompt="a cat", size="64", frames="9", steps="2")
    browser.find_element("id", "submit").click()
    err = WebDriverWait(browser, 30).until(lambda d: d.find_element("id", "err-size").text)
    assert err.startswith("size") and "WIDTHxHEIGHT" in err, err
    assert browser.find_element("id", "err-form").text == ""

    _fill(browser, size="64x64", steps="0")  # a limit the fleet enforces lands next to its field too
    browser.find_element("id", "submit").click()
    err = WebDriverWait(browser, 30).until(lambda d: d.find_element("id", "err-steps").text)
    assert "[1, 1000]" in err and browser.find_element("id", "err-size").text == ""
