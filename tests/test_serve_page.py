"""The chat page of `tq serve` in a real headless Chromium (Debian `chromium`), driven over the
DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages ending in NUL on fds 3 / 4;
stdlib only): load /, type a prompt, click Send, read the streamed answer from the page.
Skips (with the reason) only when no chromium binary is installed."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import MODEL, Server, http  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
if not CHROMIUM:
    pytest.skip("no chromium binary (Debian: apt-get install chromium; scripts/install-deps.sh)", allow_module_level=True)
if not os.path.exists(MODEL):
    pytest.skip("no model at %s" % MODEL, allow_module_level=True)


class Cdp:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tq-chromium-")
        to_r, to_w = os.pipe()      # we write commands, chromium reads fd 3
        from_r, from_w = os.pipe()  # chromium writes fd 4, we read
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
                "--disable-dev-shm-usage", "--remote-debugging-pipe", "--user-data-dir=" + self.dir, "about:blank"]
        # chromium reads fd 3 and writes fd 4: the shell puts the pipe ends there
        self.proc = subprocess.Popen(
            ["bash", "-c", 'exec "$0" "$@" 3<&%d 4>&%d' % (to_r, from_w), CHROMIUM] + args,
            pass_fds=(to_r, from_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_r)
        os.close(from_w)
        self.w = os.fdopen(to_w, "wb", buffering=0)
        self.r = os.fdopen(from_r, "rb", buffering=0)
        self.buf = b""
        self.n = 0

    def call(self, method, session=None, timeout=30, **params):
        self.n += 1
        msg = {"id": self.n, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        self.w.write(json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while time.time() < deadline:
            while b"\0" not in self.buf:
                chunk = self.r.read(65536)
                if not chunk:
                    raise RuntimeError("chromium closed the pipe")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            m = json.loads(raw)
            if m.get("id") == self.n:
                if "error" in m:
                    raise RuntimeError("%s: %s" % (method, m["error"]))
                return m["result"]
        raise TimeoutError(method)

    def close(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def test_chat_page_streams_an_answer():
    srv = Server("-c", "512", "--parallel", "2")
    cdp = None
    try:
        st, _, page = http(srv.url + "/")
        assert st == 200 and "<textarea id=\"prompt\"" in page
        cdp = Cdp()
        target = cdp.call("Target.createTarget", url=srv.url + "/")["targetId"]
        sid = cdp.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

        def js(expr):
            r = cdp.call("Runtime.evaluate", session=sid, expression=expr, returnByValue=True)
            return r["result"].get("value")

        cdp.call("Page.navigate", session=sid, url=srv.url + "/")
        ready = "location.href.startsWith(%s) && document.readyState === 'complete'" % json.dumps(srv.url)
        deadline = time.time() + 30
        while not js(ready) and time.time() < deadline:
            time.sleep(0.1)
        assert js("document.title") == "tq serve"
        js("document.getElementById('max').value = '24';"
           "document.getElementById('prompt').value = 'What is the capital of France?';"
           "document.getElementById('send').click(); true")
        partial = set()
        answer = None
        deadline = time.time() + 120
        while time.time() < deadline:
            state = js("(() => { const a = document.querySelectorAll('#log .assistant');"
                       " const x = a[a.length - 1]; return x ? [x.textContent, x.dataset.done || '', x.className] : null })()")
            if state:
                if state[1]:
                    answer = state
                    break
                if state[0]:
                    partial.add(state[0])
            time.sleep(0.02)
        assert answer is not None, "no answer on the page"
        assert "error" not in answer[2], answer[0]
        assert answer[0].strip(), "empty answer"
        assert js("document.querySelectorAll('#log .user')[0].textContent") == "What is the capital of France?"
        # streamed: text grew on the page before the end (seen as at least one shorter prefix)
        assert any(answer[0].startswith(p) and len(p) < len(answer[0]) for p in partial), partial
    finally:
        if cdp:
            cdp.close()
        assert srv.stop() == 0
