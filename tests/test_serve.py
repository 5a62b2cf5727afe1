"""`tq serve` through the official openai client and raw HTTP: chat, completions, streaming,
stop sequences, seed determinism, every error the server promises, client disconnects,
admission (queue full, KV budget) and SIGTERM draining. Few tokens, small context, to stay fast.
Run: .venv/bin/python -m pytest tests/test_serve.py (ctest: Serve.OpenAI)."""
import http.client as httpc
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.parse

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import MODEL, Server, http, metric  # noqa: E402

openai = pytest.importorskip("openai")

KEY = "test-key-123"
AUTH = {"Authorization": "Bearer " + KEY}
CTX = 384

if not os.path.exists(MODEL):
    pytest.skip("no model at %s (scripts/fetch-model.sh)" % MODEL, allow_module_level=True)


@pytest.fixture(scope="module")
def srv():
    s = Server("-c", str(CTX), "--parallel", "3", "--api-key", KEY, "--max-body", "65536")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_id(client):
    return client.models.list().data[0].id


def chat(client, model_id, text, **kw):
    kw.setdefault("max_tokens", 12)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": text}], **kw)


def test_models_and_health(srv, client):
    ms = client.models.list().data
    assert [m.id for m in ms] == ["SmolLM2-135M-Instruct.Q4_1"]
    st, _, body = http(srv.url + "/health")
    assert st == 200 and body["status"] == "ok" and body["slots"] == 3


def test_chat(client, model_id):
    r = chat(client, model_id, "What is the capital of France?")
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str) and c.message.content.strip()
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10 and 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert "Paris" in c.message.content


def test_completion(client, model_id):
    r = client.completions.create(model=model_id, prompt="The Debian project is", max_tokens=8, temperature=0)
    assert r.choices[0].text.strip()
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8


def test_stream_equals_non_stream(client, model_id):
    want = chat(client, model_id, "Name three colours.", max_tokens=16)
    parts, finish = [], None
    for ch in chat(client, model_id, "Name three colours.", max_tokens=16, stream=True):
        if ch.choices:
            parts.append(ch.choices[0].delta.content or "")
            finish = ch.choices[0].finish_reason or finish
    assert "".join(parts) == want.choices[0].message.content
    assert finish == want.choices[0].finish_reason
    # text completion streaming too
    want = client.completions.create(model=model_id, prompt="Linux is", max_tokens=8, temperature=0)
    got = "".join(c.choices[0].text for c in client.completions.create(
        model=model_id, prompt="Linux is", max_tokens=8, temperature=0, stream=True) if c.choices)
    assert got == want.choices[0].text


def test_stream_usage_and_done(srv, model_id):
    # raw SSE: data lines, a usage chunk when asked, and [DONE] last
    u = urllib.parse.urlparse(srv.url)
    conn = httpc.HTTPConnection(u.hostname, u.port, timeout=60)
    body = {"model": model_id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json", **AUTH})
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    events = [e for e in r.read().decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    usage = json.loads(events[-2][6:])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] >= 1


def test_stop_sequences(client, model_id):
    full = chat(client, model_id, "Count from one to ten in words.", max_tokens=24).choices[0].message.content
    assert len(full) > 12, full
    stop = full[8:11]
    want = full[: full.index(stop)]
    r = chat(client, model_id, "Count from one to ten in words.", max_tokens=24, stop=[stop, "zzzz"])
    assert r.choices[0].message.content == want and r.choices[0].finish_reason == "stop"
    got = "".join(c.choices[0].delta.content or "" for c in chat(
        client, model_id, "Count from one to ten in words.", max_tokens=24, stop=stop, stream=True) if c.choices)
    assert got == want


def test_seed_determinism(client, model_id):
    outs = [chat(client, model_id, "Write a word.", temperature=1.0, top_p=1.0, seed=s, max_tokens=10)
            .choices[0].message.content for s in (7, 7, 8, 9, 10)]
    assert outs[0] == outs[1]
    assert len(set(outs[1:])) > 1  # other seeds draw other tokens somewhere


def test_prefix_reuse(client, model_id):
    msgs = [{"role": "user", "content": "Tell me about Debian."}]
    r1 = client.chat.completions.create(model=model_id, messages=msgs, max_tokens=10, temperature=0)
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "And Ubuntu?"}]
    r2 = client.chat.completions.create(model=model_id, messages=msgs, max_tokens=6, temperature=0)
    assert r2.usage.prompt_tokens_details.cached_tokens > r1.usage.prompt_tokens // 2
    assert r2.choices[0].message.content.strip()


# --- errors: every one a 4xx with an OpenAI-style body ---------------------------------------

def err(srv, path, body, headers=AUTH, method="POST"):
    st, hdrs, b = http(srv.url + path, method=method, body=body, headers=dict(headers))
    assert isinstance(b, dict) and "error" in b, (st, b)
    assert isinstance(b["error"]["message"], str) and b["error"]["message"]
    return st, b["error"], hdrs


BAD_CHAT = [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (b"", 400, None),
    ({"messages": "hello"}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages"),
    ({"messages": [{"role": "user"}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages"),
    ({"messages": ["hi"]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10 ** 12}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2 ** 70}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "top_p": 0}, 400, "top_p"),
    ({"messages": [{"role": "user", "content": "x"}], "top_p": 1.5}, 400, "top_p"),
    ({"messages": [{"role": "user", "content": "x"}], "seed": "abc"}, 400, "seed"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": 5}, 400, "stop"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": [""]}, 400, "stop"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400, "stream"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "model": 7}, 400, "model"),
    ({"messages": [{"role": "user", "content": "x"}], "model": "gpt-4o"}, 404, "model"),
]


@pytest.mark.parametrize("body,status,param", BAD_CHAT)
def test_bad_chat_requests(srv, body, status, param):
    st, e, _ = err(srv, "/v1/chat/completions", body)
    assert st == status
    if param:
        assert e["param"] == param


@pytest.mark.parametrize("body", [{"prompt": 5}, {"prompt": ["a", "b"]}, {}, {"prompt": "x", "max_tokens": -1}])
def test_bad_completion_requests(srv, body):
    st, _, _ = err(srv, "/v1/completions", body)
    assert st == 400


def test_context_limit_stated(srv, client, model_id):
    long = "word " * (CTX + 50)
    st, e, _ = err(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": long}], "max_tokens": 4})
    assert st == 400 and e["code"] == "context_length_exceeded" and str(CTX) in e["message"]
    st, e, _ = err(srv, "/v1/completions", {"prompt": "hello", "max_tokens": CTX})
    assert st == 400 and str(CTX) in e["message"]
    with pytest.raises(openai.BadRequestError) as ei:
        chat(client, model_id, long)
    assert str(CTX) in str(ei.value)


def test_auth(srv, model_id):
    for h in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        st, e, _ = err(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, headers=h)
        assert st == 401 and e["code"] == "invalid_api_key"
    st, _, _ = err(srv, "/v1/models", None, headers={}, method="GET")
    assert st == 401
    assert http(srv.url + "/metrics")[0] == 401
    bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert http(srv.url + "/health")[0] == 200  # health and the page need no key


def test_body_limit_and_unknown_routes(srv):
    st, _, _ = err(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 70000}]})
    assert st == 413
    st, _, _ = err(srv, "/v1/nothing", {"a": 1})
    assert st == 404
    st, _, _ = err(srv, "/v1/chat/completions", None, method="GET")
    assert st in (404, 405)


def test_openai_client_errors(client, model_id):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_id, messages=[])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "x"}], max_tokens=-3)


def test_metrics(srv):
    _, _, text = http(srv.url + "/metrics", headers=AUTH)
    for name in ("tq_requests_total", "tq_completion_tokens_total", "tq_kv_bytes_held", "tq_active_conversations",
                 "tq_queue_depth", "tq_time_to_first_token_seconds_bucket", "tq_request_duration_seconds_count"):
        assert name in text, name
    assert metric(srv.url, "tq_completion_tokens_total", AUTH) > 0
    assert metric(srv.url, "tq_kv_bytes_held", AUTH) > 0


# --- one slot, no queue: admission, disconnects, draining --------------------------------

def stream_raw(url, body, headers=None):
    u = urllib.parse.urlparse(url)
    conn = httpc.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
    return conn, conn.getresponse()


def wait_for(cond, timeout=30):
    t = time.time() + timeout
    while time.time() < t:
        if cond():
            return True
        time.sleep(0.1)
    return False


LONG = {"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "max_tokens": 300,
        "stream": True, "temperature": 0}


def test_queue_full_disconnect_budget_and_sigterm():
    s = Server("-c", "512", "--parallel", "1", "--queue", "0", "--kv-budget", "10M")
    try:
        conn, r = stream_raw(s.url, LONG)
        assert r.status == 200
        r.readline()  # the stream has started: the one slot is taken
        st, e, hdrs = err(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
                          headers={})
        assert st == 503 and hdrs.get("Retry-After") == "1" and e["code"] == "queue_full"
        # the client goes away mid-stream: its slot is freed
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        assert wait_for(lambda: metric(s.url, "tq_active_conversations") == 0), "slot not freed"
        assert metric(s.url, "tq_requests_cancelled_total") >= 1
        st, _, b = http(s.url + "/v1/chat/completions", "POST",
                        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert st == 200 and b["usage"]["completion_tokens"] >= 1
        # a request whose KV reservation exceeds the whole budget can never run
        kvb = metric(s.url, "tq_kv_bytes_per_token")
        assert 10 * 2 ** 20 < 500 * kvb
        st, e, _ = err(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 480},
                       headers={})
        assert st == 400 and e["code"] == "kv_budget_exceeded"
        # SIGTERM drains: the running stream completes with [DONE], new requests get 503, exit 0
        conn, r = stream_raw(s.url, {**LONG, "max_tokens": 120})
        assert r.status == 200
        r.readline()
        s.proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: any("draining" in line for line in s.log), 10)
        st, _, _ = http(s.url + "/v1/chat/completions", "POST", {"messages": [{"role": "user", "content": "x"}]})
        assert st == 503
        rest = r.read().decode()
        assert rest.rstrip().endswith("data: [DONE]")
        assert s.proc.wait(60) == 0
    finally:
        s.stop()
