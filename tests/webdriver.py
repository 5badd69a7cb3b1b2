"""webdriver.py - a small W3C WebDriver client on the standard library only,
for driving headless Chromium through chromedriver in the page tests.

    with Browser(workdir, width=412, height=915) as b:
        b.get(url)
        b.wait(lambda: b.js("return document.title") == "x", 10)
        b.click(b.find(".seize"))
        b.screenshot("page.png")

WebDriver is plain HTTP + JSON: one POST /session, then a request per
command. Chromium runs headless with its own profile directory in workdir.
"""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


class WebDriverError(Exception):
    pass


def _first(*names):
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


def find_tools():
    """(chromium, chromedriver) paths, or None for what is missing."""
    return (_first("chromium", "chromium-browser", "google-chrome"),
            _first("chromedriver", "/usr/lib/chromium/chromedriver"))


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Browser:
    def __init__(self, workdir, width=1100, height=1000):
        self.chromium, self.driver_bin = find_tools()
        if not self.chromium or not self.driver_bin:
            raise WebDriverError("chromium or chromedriver is not installed")
        self.workdir = workdir
        self.width, self.height = width, height
        self.proc = None
        self.session = None
        self.base = None

    # --- life cycle ------------------------------------------------------------

    def __enter__(self):
        port = _free_port()
        self.base = "http://127.0.0.1:%d" % port
        log = open(os.path.join(self.workdir, "chromedriver.log"), "ab")
        # Own session: the driver and every browser process it starts can be
        # stopped as one group, whatever happens to this script.
        self.proc = subprocess.Popen(
            [self.driver_bin, "--port=%d" % port, "--allowed-ips=127.0.0.1"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.time() + 20
        while True:
            try:
                self._req("GET", "/status")
                break
            except (OSError, WebDriverError):
                if time.time() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise WebDriverError("chromedriver did not start (see chromedriver.log)")
                time.sleep(0.1)
        args = ["--headless=new", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--hide-scrollbars",
                "--window-size=%d,%d" % (self.width, self.height),
                "--user-data-dir=" + os.path.join(self.workdir, "chromium-profile")]
        if os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium refuses to run as root otherwise
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": self.chromium, "args": args}}}}
        try:
            v = self._req("POST", "/session", caps, timeout=60)
        except Exception:
            self.close()
            raise
        self.session = v["sessionId"]
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        if self.session:
            try:
                self._req("DELETE", "/session/" + self.session, timeout=10)
            except Exception:
                pass
            self.session = None
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None

    # --- protocol --------------------------------------------------------------

    def _req(self, method, path, body=None, timeout=30):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as res:
                out = json.loads(res.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                v = json.loads(e.read()).get("value", {})
                msg = "%s: %s" % (v.get("error"), v.get("message", "")[:300])
            except ValueError:
                msg = str(e)
            raise WebDriverError("%s %s: %s" % (method, path, msg)) from None
        return out.get("value")

    def _s(self, method, path, body=None, timeout=30):
        return self._req(method, "/session/%s%s" % (self.session, path), body, timeout)

    # --- commands --------------------------------------------------------------

    def get(self, url):
        self._s("POST", "/url", {"url": url})

    def js(self, script, *args):
        """Runs script (a function body; arguments[i] are args) and returns its value."""
        return self._s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def find(self, css):
        v = self._s("POST", "/element", {"using": "css selector", "value": css})
        return v[ELEMENT]

    def click(self, element):
        self._s("POST", "/element/%s/click" % element, {})

    def clear(self, element):
        self._s("POST", "/element/%s/clear" % element, {})

    def type(self, element, text):
        self._s("POST", "/element/%s/value" % element, {"text": text})

    def text(self, element):
        return self._s("GET", "/element/%s/text" % element)

    def screenshot(self, path):
        png = base64.b64decode(self._s("GET", "/screenshot"))
        with open(path, "wb") as f:
            f.write(png)

    def wait(self, cond, timeout, step=0.1):
        """Polls cond() until it returns a true value (returned) or timeout s pass (None)."""
        deadline = time.time() + timeout
        while True:
            try:
                v = cond()
            except WebDriverError:
                v = None
            if v:
                return v
            if time.time() > deadline:
                return None
            time.sleep(step)
