"""The console's test rig: its server in a thread of this process, and a headless browser.

``ConsoleServer`` serves ``pgstore.web.app.create_app`` with uvicorn on a free loopback
port in a thread of its own; ``chromium()`` drives Debian's chromium through its
chromedriver (``/usr/bin/chromium``, ``/usr/bin/chromedriver``: never downloaded), and
``browser_or_skip()`` skips a test, with one line, where either is missing.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = os.environ.get("PGSTORE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PGSTORE_CHROMEDRIVER", "/usr/bin/chromedriver")


def _executable(path: str) -> str | None:
    return path if os.access(path, os.X_OK) else shutil.which(os.path.basename(path))


class ConsoleServer:
    """``pgstore web`` for ``schema`` on ``dsn``, in a thread, until ``stop()``."""

    def __init__(self, dsn: str, schema: str) -> None:
        from pgstore.web.app import create_app, listening_socket, server

        self._sock = listening_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = server(create_app(dsn, schema))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the console did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self._sock.close()


@contextmanager
def console(dsn: str, schema: str) -> Iterator[ConsoleServer]:
    server = ConsoleServer(dsn, schema)
    try:
        yield server
    finally:
        server.stop()


def browser_or_skip() -> tuple[str, str]:
    """The chromium and chromedriver to use; the test skips, saying why, without them."""
    pytest.importorskip("selenium", reason="selenium is not installed (the test extra)")
    chromium = _executable(CHROMIUM)
    driver = _executable(CHROMEDRIVER)
    if chromium is None or driver is None:
        pytest.skip("no chromium / chromedriver: apt-get install chromium chromium-driver")
    return chromium, driver


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A headless chromium under selenium (a fresh profile), quit at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = browser_or_skip()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 f"--window-size={width},{height}", "--force-device-scale-factor=1"):
        options.add_argument(flag)
    browser = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield browser
    finally:
        browser.quit()
