"""The sandbox's dashboard in a real browser: Debian's chromium, headless, through its
chromedriver and Selenium (never Selenium Manager's download). A person signs in, creates an
API key and registers an application through the pages, and both work against the sandbox;
then the application is deleted, past its confirmation.

Screenshots go to the test's temporary directory; scripts/dashboard-screenshots.sh sets
KEYTURN_DASHBOARD_SCREENSHOTS=docs/img to regenerate the ones docs/sandbox.md shows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.sandbox import SandboxProcess

pytestmark = pytest.mark.sandbox

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"  # Debian's chromium-driver (scripts/system-deps.sh)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1100,1000",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        options.add_argument(argument)
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _fill(
    driver: webdriver.Chrome, fields: dict[str, str], button: str, *, confirm: bool = False
) -> None:
    """Fill the fields, press the button (and accept its confirmation), and wait until the
    page it posts to has replaced this one: an element looked up sooner could be the old
    page's, gone (stale) a moment later."""
    for ident, value in fields.items():
        driver.find_element(By.ID, ident).send_keys(value)
    page = driver.find_element(By.TAG_NAME, "html")
    driver.find_element(By.XPATH, f"//button[normalize-space()='{button}']").click()
    if confirm:
        WebDriverWait(driver, 10).until(lambda d: d.switch_to.alert).accept()
    WebDriverWait(driver, 10).until(expected_conditions.staleness_of(page))


def _text(driver: webdriver.Chrome, ident: str) -> str:
    return str(WebDriverWait(driver, 10).until(lambda d: d.find_element(By.ID, ident)).text)


def _screenshot(driver: webdriver.Chrome, name: str, tmp_path: Path) -> None:
    """Into KEYTURN_DASHBOARD_SCREENSHOTS when set (docs/img), else the test's directory."""
    directory = Path(os.environ.get("KEYTURN_DASHBOARD_SCREENSHOTS") or tmp_path)
    driver.set_window_size(1100, 300)  # the page's own height, not the window's, is measured
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1100, min(int(height) + 140, 2400))
    assert driver.save_screenshot(str(directory / name))


def test_a_person_makes_a_key_and_an_app_in_the_browser_and_both_work(
    sandbox: SandboxProcess, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    base = sandbox.base_url
    browser.get(f"{base}/dashboard")
    assert browser.current_url == f"{base}/dashboard/sign-in"
    _fill(browser, {"admin_token": sandbox.admin_token}, "Sign in")
    WebDriverWait(browser, 10).until(lambda d: d.current_url == f"{base}/dashboard")
    cookie = browser.get_cookie("ktsb_dashboard")
    assert cookie is not None
    assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")
    assert "expiry" in cookie
    assert browser.execute_script("return document.cookie") == ""  # HttpOnly: not for scripts

    _fill(browser, {"key_name": "reporting", "key_description": "nightly export"}, "Create API key")
    key = _text(browser, "shown-once")
    copy = browser.find_element(By.CSS_SELECTOR, "button[data-copy='shown-once']")
    copy.click()  # the script ran under the page's Content-Security-Policy
    WebDriverWait(browser, 10).until(lambda d: copy.text != "Copy")
    _screenshot(browser, "dashboard-api-key.png", tmp_path)
    assert key not in browser.current_url
    answer = HTTP.get(f"{base}/v1/users", headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200

    browser.get(f"{base}/dashboard")
    app_fields = {"app_name": "reporting", "app_redirect_uri": "https://reporting.example/callback"}
    _fill(browser, app_fields, "Register application")
    client_id, secret = _text(browser, "client-id"), _text(browser, "shown-once")
    grant = {"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret}
    issued = HTTP.post(f"{base}/oauth/token", json=grant)
    assert issued.status_code == 200
    bearer = {"Authorization": f"Bearer {issued.json()['access_token']}"}
    assert HTTP.get(f"{base}/v1/projects", headers=bearer).status_code == 200

    _fill(browser, {}, "Rotate client secret")
    rotated = _text(browser, "shown-once")
    assert rotated != secret
    _screenshot(browser, "dashboard-oauth-app.png", tmp_path)
    renewed = HTTP.post(f"{base}/oauth/token", json={**grant, "client_secret": rotated})
    assert renewed.status_code == 200

    browser.get(f"{base}/dashboard")
    _screenshot(browser, "dashboard.png", tmp_path)
    page = browser.page_source
    assert "reporting" in page
    assert key not in page
    assert sandbox.admin_token not in page

    browser.get(f"{base}/dashboard/oauth-apps/{client_id}")
    _fill(browser, {}, "Delete this application", confirm=True)
    notice = _text(browser, "notice")
    assert notice.startswith("Deleted the application reporting")
    gone = HTTP.post(f"{base}/oauth/token", json={**grant, "client_secret": rotated})
    assert gone.status_code == 401
