"""Screenshots of viewer pages as a person first sees them (no hover, no click),
in the headless Chromium the browser tests use, for the docs:

    captum-iglens "What is the capital of France?" --top-k 5 \\
        --max-new-tokens 10 --html a10.html
    captum-iglens "Write a short poem about the sea, in three stanzas." \\
        --top-k 5 --max-new-tokens 200 --html a200.html
    python -m tests.viewer.screenshots a10.html docs/viewer-10.png \\
        a200.html docs/viewer-200.png

Pages and PNGs alternate on the command line; the window is 1920 x 1080."""

import shutil
import sys
import time
from pathlib import Path
from typing import List


def shoot(pairs: List[str], size: str = "1920,1080") -> None:
    """Opens each page and saves its screenshot; fails on any console error."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument(f"--window-size={size}")
    driver = webdriver.Chrome(
        service=Service(shutil.which("chromedriver") or "chromedriver"),
        options=options,
    )
    try:
        for page, png in zip(pairs[::2], pairs[1::2]):
            driver.get(Path(page).resolve().as_uri())
            time.sleep(0.5)
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            if errors:
                raise RuntimeError(f"{page}: console errors {errors}")
            driver.save_screenshot(png)
            print(f"{page} -> {png}")
    finally:
        driver.quit()


if __name__ == "__main__":
    if len(sys.argv) < 3 or len(sys.argv) % 2 == 0:
        sys.exit("usage: python -m tests.viewer.screenshots PAGE PNG [PAGE PNG ...]")
    shoot(sys.argv[1:])
