#!/usr/bin/env python3
"""Load generator for `tq serve` (loopback only, bounded in count and time). Starts the server
itself (tests/serve_util.py: --port 0 on 127.0.0.1), runs one experiment, prints one JSON object
and stops the server with SIGTERM.

  load   : C concurrent clients x R streamed chat requests each, prompts of mixed lengths
           (corpus slices of 16..~700 tokens); p50/p95 time to first token, aggregate tok/s,
           failures.
  decode : N requests at once (short prompt, ignore_eos, T tokens each); aggregate decode tok/s
           over the span where all N decode together (first token of the last to start until the
           first to end).
  admit  : N streamed requests each reserving the whole context (-c) at once; how many the
           server admits (tq_active_conversations) and queues, read from /metrics; then all close.
  turn2  : a conversation's second turn: time to first token with the first turn's KV reused
           (run the server with and without --no-prefix-reuse).

Usage: bench/serve_load.py MODE [--clients C] [--requests R] ... -- SERVER_ARGS...
"""
import argparse
import http.client as httpc
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from serve_util import ROOT, Server, http, metric  # noqa: E402

CORPUS = os.path.join(ROOT, "data", "debian-reference.en.txt")


def stream(host, port, body, timeout, on_open=None):
    """One streamed chat request: (ok, ttft_s, total_s, completion_tokens, error)."""
    t0 = time.perf_counter()
    try:
        conn = httpc.HTTPConnection(host, port, timeout=timeout)
        body = dict(body, stream=True, stream_options={"include_usage": True})
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            return False, None, time.perf_counter() - t0, 0, "HTTP %d %s" % (r.status, r.read()[:200])
        if on_open:
            on_open(conn)
        ttft, toks, done = None, 0, False
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                done = True
                break
            j = json.loads(data)
            if "error" in j:
                return False, ttft, time.perf_counter() - t0, toks, j["error"]["message"]
            if j.get("usage"):
                toks = j["usage"]["completion_tokens"]
            if ttft is None and j["choices"] and j["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - t0
        conn.close()
        return done, ttft, time.perf_counter() - t0, toks, None if done else "no [DONE]"
    except Exception as e:  # noqa: BLE001 - a failed request is a result here
        return False, None, time.perf_counter() - t0, 0, repr(e)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else None


def prompts(n, seed=1):
    text = open(CORPUS, encoding="utf-8", errors="replace").read()
    words = [4, 40, 150, 500]  # mixed prompt lengths (words of corpus text before the question)
    out = []
    for i in range(n):
        w = words[i % len(words)]
        off = (seed * 7919 + i * 104729) % max(1, len(text) - 20000)
        chunk = " ".join(text[off:off + 20000].split()[:w])
        out.append("Summarize this text in one sentence:\n" + chunk)
    return out


def run_load(srv, a):
    host, port = srv.url[7:].split(":")
    ps = prompts(a.clients * a.requests)
    results = []
    lock = threading.Lock()

    def client(c):
        for r in range(a.requests):
            body = {"messages": [{"role": "user", "content": ps[c * a.requests + r]}],
                    "max_tokens": a.max_tokens, "temperature": 0}
            res = stream(host, int(port), body, a.timeout)
            with lock:
                results.append(res)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(a.timeout * a.requests)
    wall = time.perf_counter() - t0
    ok = [r for r in results if r[0]]
    ttfts = [r[1] for r in ok if r[1] is not None]
    toks = sum(r[3] for r in ok)
    return {"clients": a.clients, "requests_per_client": a.requests, "max_tokens": a.max_tokens,
            "requests": len(results), "ok": len(ok), "failures": len(results) - len(ok),
            "errors": sorted({str(r[4]) for r in results if not r[0]})[:5],
            "ttft_p50_s": pct(ttfts, 50), "ttft_p95_s": pct(ttfts, 95),
            "completion_tokens": toks, "wall_s": wall, "aggregate_tok_s": toks / wall}


def run_decode(srv, a):
    host, port = srv.url[7:].split(":")
    n = a.clients
    marks = [None] * n  # (time of first token, time of end, tokens)
    body = {"messages": [{"role": "user", "content": "Write a long story about a dragon."}],
            "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True}

    def one(i):
        t0 = time.perf_counter()
        ok, ttft, total, toks, err = stream(host, int(port), body, a.timeout)
        marks[i] = (t0 + ttft if ttft else None, t0 + total, toks, ok)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(a.timeout)
    assert all(m and m[3] for m in marks), marks
    start = max(m[0] for m in marks)  # every slot decoding from here
    end = min(m[1] for m in marks)    # until the first one ends
    # tokens each made in [start, end]: its rate over its own decode span, times the overlap
    toks = sum((m[2] - 1) * (end - start) / (m[1] - m[0]) for m in marks)
    return {"active_slots": n, "tokens_each": a.max_tokens, "overlap_s": end - start,
            "aggregate_decode_tok_s": toks / (end - start),
            "per_slot_tok_s": [(m[2] - 1) / (m[1] - m[0]) for m in marks]}


def run_admit(srv, a):
    host, port = srv.url[7:].split(":")
    conns = []
    lock = threading.Lock()

    def opened(c):
        with lock:
            conns.append(c)

    body = {"messages": [{"role": "user", "content": "Write a very long story."}], "temperature": 0,
            "ignore_eos": True}  # no max_tokens: each reserves the rest of the context
    results = []
    ts = [threading.Thread(target=lambda: results.append(stream(host, int(port), body, 60, opened)), daemon=True)
          for _ in range(a.clients)]
    for t in ts:
        t.start()
    time.sleep(a.settle)
    active = metric(srv.url, "tq_active_conversations")
    queued = metric(srv.url, "tq_queue_depth")
    reserved = metric(srv.url, "tq_kv_bytes_reserved")
    budget = metric(srv.url, "tq_kv_budget_bytes")
    bpt = metric(srv.url, "tq_kv_bytes_per_token")
    for c in list(conns):
        try:
            c.sock.shutdown(2)
            c.close()
        except Exception:  # noqa: BLE001
            pass
    time.sleep(1)
    return {"requests": a.clients, "errors": sorted({str(r[4]) for r in results if r[4]})[:5], "admitted": active, "queued": queued, "kv_bytes_reserved": reserved,
            "kv_budget": budget, "kv_bytes_per_token": bpt}


def run_turn2(srv, a):
    host, port = srv.url[7:].split(":")
    text = prompts(4)[3]  # the longest prompt kind (~500 words)
    msgs = [{"role": "user", "content": text}]
    _, _, r1 = http(srv.url + "/v1/chat/completions", "POST",
                    {"messages": msgs, "max_tokens": 16, "temperature": 0}, timeout=a.timeout)
    msgs += [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
             {"role": "user", "content": "Now say it in three words."}]
    ok, ttft, total, toks, err = stream(host, int(port), {"messages": msgs, "max_tokens": 4, "temperature": 0},
                                        a.timeout)
    assert ok, err
    return {"turn1_prompt_tokens": r1["usage"]["prompt_tokens"], "turn2_ttft_s": ttft}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["load", "decode", "admit", "turn2"])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--settle", type=float, default=5, help="admit: seconds before reading /metrics")
    ap.add_argument("--repeat", type=int, default=1, help="turn2: runs (a fresh server each), median")
    ap.add_argument("--out", help="also write the JSON here")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    sargs = argv[cut + 1:]
    assert a.clients <= 64 and a.requests <= 32, "bounded load only"
    runs = []
    for _ in range(a.repeat if a.mode == "turn2" else 1):
        srv = Server(*sargs)
        try:
            res = {"load": run_load, "decode": run_decode, "admit": run_admit, "turn2": run_turn2}[a.mode](srv, a)
        finally:
            rc = srv.stop()
        res["server_exit"] = rc
        runs.append(res)
    out = runs[0] if len(runs) == 1 else {"runs": runs,
                                          "turn2_ttft_median_s": statistics.median(r["turn2_ttft_s"] for r in runs)}
    out["mode"] = a.mode
    out["server_args"] = sargs
    s = json.dumps(out, indent=1)
    print(s)
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        open(a.out, "w").write(s + "\n")


if __name__ == "__main__":
    main()
