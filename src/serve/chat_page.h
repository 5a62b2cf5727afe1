// The chat page served at / by `tq serve`: static HTML + JS, no build step. It keeps the
// conversation in the page, posts it to /v1/chat/completions with stream: true and appends the
// streamed deltas to the answer as they arrive (SSE parsed from fetch's body reader). Element
// ids used by tests/test_serve_page.py: #prompt, #send, #key, #log; the newest answer is the
// last .assistant element, which gets data-done="1" when its stream has ended.
#pragma once

namespace tq::serve {

inline const char* kChatPage = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tq serve</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font-family:system-ui,sans-serif;max-width:48rem;margin:1rem auto;padding:0 1rem;color:#222}
#log div{white-space:pre-wrap;padding:.5rem .7rem;margin:.4rem 0;border-radius:.4rem}
.user{background:#e8f0fe}.assistant{background:#f3f3f3}.error{background:#fde8e8}
form{display:flex;gap:.5rem}textarea{flex:1;height:4rem}small{color:#666}
</style></head><body>
<h1>tq serve</h1>
<p><small>TurboQuant-compressed KV cache. <label>API key <input id="key" type="password" size="12"></label>
<label>max tokens <input id="max" type="number" value="256" min="1" style="width:5rem"></label>
<button id="clear" type="button">new chat</button></small></p>
<div id="log"></div>
<form id="f"><textarea id="prompt" placeholder="Message"></textarea><button id="send" type="submit">Send</button></form>
<script>
"use strict";
const msgs = [];
const log = document.getElementById("log");
function add(cls, text) {
  const d = document.createElement("div");
  d.className = cls; d.textContent = text; log.appendChild(d); return d;
}
document.getElementById("clear").onclick = () => { msgs.length = 0; log.textContent = ""; };
document.getElementById("f").onsubmit = async (ev) => {
  ev.preventDefault();
  const p = document.getElementById("prompt");
  const text = p.value.trim();
  if (!text) return;
  p.value = "";
  msgs.push({role: "user", content: text});
  add("user", text);
  const out = add("assistant", "");
  const headers = {"Content-Type": "application/json"};
  const key = document.getElementById("key").value;
  if (key) headers["Authorization"] = "Bearer " + key;
  const max = parseInt(document.getElementById("max").value, 10) || 256;
  let answer = "";
  try {
    const r = await fetch("/v1/chat/completions", {method: "POST", headers,
      body: JSON.stringify({messages: msgs, stream: true, max_tokens: max})});
    if (!r.ok) {
      const e = await r.json().catch(() => ({}));
      throw new Error((e.error && e.error.message) || ("HTTP " + r.status));
    }
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, i); buf = buf.slice(i + 2);
        if (!ev.startsWith("data: ")) continue;
        const data = ev.slice(6);
        if (data === "[DONE]") continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        const c = j.choices && j.choices[0] && j.choices[0].delta && j.choices[0].delta.content;
        if (c) { answer += c; out.textContent = answer; }
      }
    }
    msgs.push({role: "assistant", content: answer});
  } catch (e) {
    out.className = "assistant error";
    out.textContent = answer + "\n[" + e.message + "]";
    msgs.pop();
  }
  out.dataset.done = "1";
};
</script></body></html>
)HTML";

}  // namespace tq::serve
