"""Starts `tq serve` on a free loopback port for the server tests (tests/test_serve*.py)."""
import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def tq_path():
    p = os.environ.get("TQ_CLI_PATH") or os.path.join(ROOT, "build", "tq")
    return p


class Server:
    """`tq serve ARGS --port 0`; .url once it listens, .stop() sends SIGTERM and waits."""

    def __init__(self, *args, timeout=120):
        cmd = [tq_path(), "serve", "-m", MODEL, "--port", "0", "-t", "2"] + list(args)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + timeout
        self.url = None
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            if m:
                self.url = m.group(1)
                break
        if not self.url:
            self.proc.kill()
            raise RuntimeError("tq serve did not start: " + "".join(self.log))
        # keep draining stderr so the server never blocks on a full pipe
        self._t = threading.Thread(target=self._drain, daemon=True)
        self._t.start()

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def http(url, method="GET", body=None, headers=None, timeout=60):
    """(status, headers, parsed JSON or text) of one request; never raises on HTTP errors."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None and "Content-Type" not in (headers or {}):
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, hdrs, raw = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, dict(e.headers), e.read()
    try:
        return status, hdrs, json.loads(raw)
    except ValueError:
        return status, hdrs, raw.decode("utf-8", "replace")


def metric(url, name, headers=None):
    _, _, text = http(url + "/metrics", headers=headers)
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)
