// `tq serve`: OpenAI-style HTTP API over the scheduler (scheduler.h). HTTP and JSON only:
// parsing and checking requests, the chat template, SSE streaming, auth, metrics. Every bad
// input becomes a 4xx with an OpenAI-style error body {"error": {"message", "type", "param",
// "code"}}.
#pragma once

#include <cstddef>
#include <string>

#include "serve/scheduler.h"

namespace tq::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;           // non-empty: /v1/* and /metrics need "Authorization: Bearer KEY"
  std::string model_id;          // the name /v1/models lists and requests must use
  size_t max_body = 1 << 20;     // request body limit in bytes (413 beyond)
  int http_threads = 0;          // 0: enough for every slot and queued request plus a few
  std::string port_file;         // non-empty: the bound port is written there once listening
};

// Serves until SIGTERM / SIGINT, then stops admitting (503), lets every admitted and queued
// request finish and returns 0. Throws tq::Error when it cannot bind.
int run_server(const ServerOptions& so, const LlamaModel& model, const Tokenizer& tok, const KvSpec& kv,
               const SchedulerOptions& sched);

}  // namespace tq::serve
