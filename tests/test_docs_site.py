"""The documentation site in a real browser: built with ``mkdocs build --strict`` (as ``make docs`` does),
served on 127.0.0.1 and opened in headless Chromium, which is driven over the DevTools protocol on a
pipe (``--remote-debugging-pipe``: no driver to install). The home page, a guide, the reference pages and
a search for "population" must render with their title, a code block and a search hit; the screenshots
are kept in site-check/ (a build artefact, gitignored) for a person to look at.

Skipped, with the reason, where mkdocs (the ``docs`` extra) or Chromium (Debian's ``chromium``) is absent.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import importlib.util
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "site-check"
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
WIDTH, HEIGHT = 1280, 900
TIMEOUT_S = 20.0  # for one page to show what is checked

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("mkdocs") is None,
        reason="mkdocs is not installed (the docs extra: pip install -e '.[docs]', or make venv)",
    ),
    pytest.mark.skipif(
        CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)"
    ),
]


class Browser:
    """Headless Chromium, one tab, driven over the DevTools protocol: JSON messages ending in a NUL byte,
    written to its fd 3 and read from its fd 4."""

    def __init__(self, profile: Path) -> None:
        to_browser_read, self.to_browser = os.pipe()
        self.from_browser, from_browser_write = os.pipe()

        def give_pipes() -> None:  # in the child: the protocol's fds 3 and 4
            os.dup2(to_browser_read, 3)
            os.dup2(from_browser_write, 4)

        self.process = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",  # as root, in CI's container
                "--disable-gpu",
                "--disable-dev-shm-usage",  # a container's small /dev/shm
                "--hide-scrollbars",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            preexec_fn=give_pipes,
            pass_fds=(3, 4),  # kept open through the exec (the other fds are closed)
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self.messages: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self.read, daemon=True).start()
        self.next_id = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=WIDTH,
            height=HEIGHT,
            deviceScaleFactor=1,
            mobile=False,
        )

    def read(self) -> None:
        """Chromium's messages into the queue, until it closes the pipe (or close() does)."""
        buffer = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(self.from_browser, 1 << 16):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for message in messages:
                    self.messages.put(json.loads(message))

    def call(self, method: str, **params) -> dict:
        """Send a command (to the tab once attached) and return its result; events are passed over."""
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if method.split(".")[0] not in ("Target", "Browser"):
            message["sessionId"] = self.session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            reply = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"Chromium refused {method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def open(self, url: str, ready: str) -> None:
        """Load ``url`` and wait until the JavaScript expression ``ready`` is true (page scripts, such as
        the search, finish after the load event)."""
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + TIMEOUT_S
        while not self.evaluate(f"document.readyState === 'complete' && Boolean({ready})"):
            assert time.monotonic() < deadline, f"{url}: not shown within {TIMEOUT_S} s: {ready}"
            time.sleep(0.1)

    def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        path.write_bytes(data)
        return data

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError, queue.Empty):
            self.call("Browser.close")
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.to_browser)
        os.close(self.from_browser)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    """The site built in strict mode from this checkout, served on a free port; its URL."""
    directory = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(directory)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stdout}{build.stderr}"
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(directory))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    SCREENSHOTS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        chromium = Browser(Path(profile))
        yield chromium
        chromium.close()


CODE_BLOCK = "[...document.querySelectorAll('article pre code')].map(code => code.textContent).join('\\n')"


@pytest.mark.parametrize(
    "path, title, code",
    [
        ("index.html", "phalanx", "make demo"),  # the README
        ("population.html", "Population-based training - phalanx", "phalanx population run"),
        ("reference/api/vecenv.html", "The VecEnv contract - phalanx", "check_vec_env("),
        ("reference/cli.html", "CLI reference - phalanx", "--num-envs"),
        ("reference/configuration.html", "Configuration reference - phalanx", None),
    ],
    ids=["home", "guide", "api", "cli", "configuration"],
)
def test_page_renders_with_its_title_and_a_code_block(site, browser, path, title, code):
    browser.open(f"{site}/{path}", "document.querySelector('article h1')")
    shot = browser.screenshot(SCREENSHOTS / path.replace("/", "-").replace(".html", ".png"))
    assert shot.startswith(b"\x89PNG") and len(shot) > 20_000, "the screenshot is not a rendered page"
    assert browser.evaluate("document.title") == title
    # the stylesheet applied: Material's header is fixed at the top, the text is laid out beside the nav
    assert browser.evaluate("getComputedStyle(document.querySelector('header')).position") in (
        "fixed",
        "sticky",
    )
    if code is None:  # the configuration reference: tables of fields
        text = browser.evaluate("document.querySelector('article table').textContent")
        assert "num_envs" in text and "Sub-environments stepped as one batch." in text
    else:
        assert code in browser.evaluate(CODE_BLOCK), f"no code block of {path} shows {code!r}"


def test_search_finds_population(site, browser):
    """Material's search (a web worker over search/search_index.json), asked through the page's URL."""
    results = "document.querySelectorAll('.md-search-result__item')"
    browser.open(f"{site}/index.html?q=population", f"{results}.length > 0")
    browser.screenshot(SCREENSHOTS / "search-population.png")
    hits = browser.evaluate(f"[...{results}].map(item => item.querySelector('a').getAttribute('href'))")
    assert any("population.html" in hit for hit in hits), f"no hit on the population guide: {hits}"
    assert "population" in browser.evaluate(f"{results}[0].textContent").lower()
