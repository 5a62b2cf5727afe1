// HTTP edge of `tq serve` (server.h): cpp-httplib + nlohmann-json, no model logic.
#include "serve/server.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <httplib.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>

#include "serve/chat_page.h"
#include "tq/error.h"

namespace tq::serve {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A 4xx / 5xx with an OpenAI-style body.
struct ApiError {
  int status;
  std::string message, type, param, code;
};

ApiError bad(const std::string& msg, const std::string& param = "", const std::string& code = "") {
  return {400, msg, "invalid_request_error", param, code};
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  json err = {{"message", e.message}, {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  res.set_content(dump({{"error", err}}), "application/json");
}

// Prometheus histogram with fixed buckets (seconds).
struct Histogram {
  static constexpr std::array<double, 12> kBounds = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  std::array<uint64_t, 13> counts{};
  double sum = 0;
  uint64_t n = 0;
  void observe(double v) {
    size_t i = 0;
    while (i < kBounds.size() && v > kBounds[i]) ++i;
    ++counts[i];
    sum += v;
    ++n;
  }
  void write(std::string& out, const std::string& name, const std::string& help) const {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
    uint64_t cum = 0;
    char buf[128];
    for (size_t i = 0; i < kBounds.size(); ++i) {
      cum += counts[i];
      std::snprintf(buf, sizeof buf, "%s_bucket{le=\"%g\"} %llu\n", name.c_str(), kBounds[i],
                    static_cast<unsigned long long>(cum));
      out += buf;
    }
    cum += counts[kBounds.size()];
    std::snprintf(buf, sizeof buf, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name.c_str(),
                  static_cast<unsigned long long>(cum), name.c_str(), sum, name.c_str(),
                  static_cast<unsigned long long>(n));
    out += buf;
  }
};

struct Metrics {
  std::mutex mu;
  std::map<std::pair<std::string, int>, uint64_t> requests;  // (endpoint, status) -> count
  Histogram ttft, latency;
};

// A parsed, checked completion request.
struct Parsed {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  std::vector<int32_t> prompt;
  GenParams gen;
};

int g_sig_pipe[2] = {-1, -1};
void on_signal(int sn) {
  const char c = static_cast<char>(sn);
  (void)!write(g_sig_pipe[1], &c, 1);
}

uint64_t next_seed_salt() {
  static std::atomic<uint64_t> n{0};
  return ++n;
}

bool is_int(const json& v) { return v.is_number_integer() || v.is_number_unsigned(); }

class Server {
 public:
  Server(const ServerOptions& so, const LlamaModel& model, const Tokenizer& tok, Scheduler& sched)
      : so_(so), model_(model), tok_(tok), sched_(sched) {}

  int run();

 private:
  Parsed parse(const std::string& body, bool chat) const;
  void completion(const httplib::Request& req, httplib::Response& res, bool chat);
  std::string metrics_text();
  void count(const std::string& endpoint, int status) {
    std::lock_guard<std::mutex> lk(metrics_.mu);
    ++metrics_.requests[{endpoint, status}];
  }

  const ServerOptions& so_;
  const LlamaModel& model_;
  const Tokenizer& tok_;
  Scheduler& sched_;
  httplib::Server svr_;
  Metrics metrics_;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{1};
  // Streamed responses not yet released by the HTTP library. Stopping the server cuts every
  // chunked response still being written, so the drain waits for this to reach zero first.
  std::mutex streams_mu_;
  std::condition_variable streams_cv_;
  int open_streams_ = 0;
  // Prefix reuse across turns: the tokens this server generated for recent answers, by text.
  // A follow-up turn that quotes an answer as an assistant message gets these tokens for it
  // instead of a re-tokenization of the text (which may split it differently), so its prompt
  // starts with exactly the tokens the slot's cache holds (KvCache has no truncation: the
  // scheduler reuses a cache only when it holds a prefix of the new prompt).
  mutable std::mutex answers_mu_;
  std::deque<std::pair<std::string, std::vector<int32_t>>> answers_;
  void remember(const std::string& text, const Event& last) {
    if (last.cut || last.ids.empty() || !last.error.empty()) return;
    std::lock_guard<std::mutex> lk(answers_mu_);
    answers_.emplace_back(text, last.ids);
    while (answers_.size() > static_cast<size_t>(4 * sched_.options().parallel + 16)) answers_.pop_front();
  }
  bool recall(const std::string& text, std::vector<int32_t>& ids) const {
    std::lock_guard<std::mutex> lk(answers_mu_);
    for (auto it = answers_.rbegin(); it != answers_.rend(); ++it)
      if (it->first == text) {
        ids = it->second;
        return true;
      }
    return false;
  }
};

Parsed Server::parse(const std::string& body, bool chat) const {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw bad("the request body is not valid JSON");
  if (!j.is_object()) throw bad("the request body must be a JSON object");
  Parsed p;
  p.chat = chat;
  if (j.contains("model")) {
    if (!j["model"].is_string()) throw bad("'model' must be a string", "model");
    const std::string m = j["model"];
    if (!m.empty() && m != so_.model_id)
      throw ApiError{404, "The model '" + m + "' does not exist; this server serves '" + so_.model_id + "'",
                     "invalid_request_error", "model", "model_not_found"};
  }
  auto number = [&](const char* key, double lo, double hi, double def) {
    if (!j.contains(key) || j[key].is_null()) return def;
    if (!j[key].is_number()) throw bad(std::string("'") + key + "' must be a number", key);
    const double v = j[key];
    if (!(v >= lo && v <= hi)) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "'%s' must be in [%g, %g], got %g", key, lo, hi, v);
      throw bad(buf, key);
    }
    return v;
  };
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) throw bad("'stream' must be a boolean", "stream");
    p.stream = j["stream"];
  }
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const auto& so = j["stream_options"];
    if (!so.is_object()) throw bad("'stream_options' must be an object", "stream_options");
    if (so.contains("include_usage")) {
      if (!so["include_usage"].is_boolean()) throw bad("'stream_options.include_usage' must be a boolean", "stream_options");
      p.include_usage = so["include_usage"];
    }
  }
  if (j.contains("ignore_eos") && !j["ignore_eos"].is_null()) {  // llama.cpp's extension
    if (!j["ignore_eos"].is_boolean()) throw bad("'ignore_eos' must be a boolean", "ignore_eos");
    p.gen.ignore_eos = j["ignore_eos"];
  }
  if (j.contains("n") && !j["n"].is_null() && !(is_int(j["n"]) && j["n"].get<int64_t>() == 1))
    throw bad("only n = 1 is supported", "n");
  p.gen.sampler.temperature = static_cast<float>(number("temperature", 0, 2, 1.0));
  p.gen.sampler.top_p = static_cast<float>(number("top_p", 0, 1, 1.0));
  if (p.gen.sampler.top_p <= 0) throw bad("'top_p' must be > 0", "top_p");
  if (j.contains("seed") && !j["seed"].is_null()) {
    if (!is_int(j["seed"])) throw bad("'seed' must be an integer", "seed");
    p.gen.sampler.seed = j["seed"].is_number_unsigned() ? j["seed"].get<uint64_t>()
                                                         : static_cast<uint64_t>(j["seed"].get<int64_t>());
  } else {
    p.gen.sampler.seed = std::random_device{}() * 0x9E3779B97F4A7C15ull + next_seed_salt();
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const auto& s = j["stop"];
    std::vector<std::string> stops;
    if (s.is_string()) stops.push_back(s);
    else if (s.is_array()) {
      if (s.size() > 4) throw bad("'stop' holds at most 4 sequences", "stop");
      for (const auto& x : s) {
        if (!x.is_string()) throw bad("'stop' must be a string or an array of strings", "stop");
        stops.push_back(x);
      }
    } else {
      throw bad("'stop' must be a string or an array of strings", "stop");
    }
    for (const auto& x : stops)
      if (x.empty()) throw bad("'stop' sequences must not be empty", "stop");
    p.gen.stop = stops;
  }
  // The prompt: messages through the model's chat template, or the raw prompt text.
  try {
    if (chat) {
      if (!j.contains("messages")) throw bad("'messages' is required", "messages");
      const auto& ms = j["messages"];
      if (!ms.is_array()) throw bad("'messages' must be an array", "messages");
      if (ms.empty()) throw bad("'messages' must not be empty", "messages");
      std::vector<ChatMessage> msgs;
      for (size_t i = 0; i < ms.size(); ++i) {
        const auto& m = ms[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) throw bad(where + " must be an object", "messages");
        if (!m.contains("role") || !m["role"].is_string()) throw bad(where + ".role must be a string", "messages");
        std::string role = m["role"];
        if (role == "developer") role = "system";
        if (role != "system" && role != "user" && role != "assistant")
          throw bad(where + ".role '" + role + "' is not one of system, developer, user, assistant", "messages");
        if (!m.contains("content")) throw bad(where + ".content is required", "messages");
        const auto& c = m["content"];
        std::string text;
        if (c.is_string()) {
          text = c;
        } else if (c.is_array()) {
          for (const auto& part : c) {
            if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
                !part["text"].is_string())
              throw bad(where + ".content parts must be {\"type\": \"text\", \"text\": string}", "messages");
            text += part["text"].get<std::string>();
          }
        } else {
          throw bad(where + ".content must be a string or an array of text parts", "messages");
        }
        msgs.push_back({role, text});
      }
      // The template rendered message by message (each piece ends at a special token, so the
      // pieces tokenize as the whole does); an answer this server generated keeps its tokens.
      p.prompt.clear();
      for (size_t i = 0; i < msgs.size(); ++i) {
        std::vector<ChatMessage> one(msgs.begin(), msgs.begin() + i + 1);
        std::string seg = tok_.apply_chat_template(one, false);
        if (i > 0) seg = seg.substr(tok_.apply_chat_template({msgs.begin(), msgs.begin() + i}, false).size());
        std::vector<int32_t> ids;
        const std::string head = "<|im_start|>assistant\n", tail = "<|im_end|>\n";
        if (msgs[i].role == "assistant" && recall(msgs[i].content, ids) && seg.size() >= head.size() + tail.size() &&
            seg.compare(seg.size() - tail.size(), tail.size(), tail) == 0 &&
            seg.compare(seg.size() - tail.size() - msgs[i].content.size() - head.size(), head.size(), head) == 0) {
          const std::string before = seg.substr(0, seg.size() - tail.size() - msgs[i].content.size());
          auto a = i == 0 ? tok_.encode_with_bos(before, true) : tok_.encode(before, true);
          auto b = tok_.encode(tail, true);
          p.prompt.insert(p.prompt.end(), a.begin(), a.end());
          p.prompt.insert(p.prompt.end(), ids.begin(), ids.end());
          p.prompt.insert(p.prompt.end(), b.begin(), b.end());
        } else {
          auto a = i == 0 ? tok_.encode_with_bos(seg, true) : tok_.encode(seg, true);
          p.prompt.insert(p.prompt.end(), a.begin(), a.end());
        }
      }
      {
        auto g = tok_.encode("<|im_start|>assistant\n", true);
        p.prompt.insert(p.prompt.end(), g.begin(), g.end());
      }
    } else {
      if (!j.contains("prompt")) throw bad("'prompt' is required", "prompt");
      const auto& pr = j["prompt"];
      std::string text;
      if (pr.is_string()) text = pr;
      else if (pr.is_array() && pr.size() == 1 && pr[0].is_string()) text = pr[0];
      else throw bad("'prompt' must be a string (or an array of one string)", "prompt");
      p.prompt = tok_.encode_with_bos(text, /*parse_special=*/false);
      if (p.prompt.empty()) throw bad("'prompt' is empty", "prompt");
    }
  } catch (const Error& e) {
    throw bad(std::string("the prompt cannot be tokenized: ") + e.what(), chat ? "messages" : "prompt");
  }
  const int ctx = sched_.options().ctx;
  const int n_prompt = static_cast<int>(p.prompt.size());
  const char* mt = j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (j.contains(mt) && !j[mt].is_null()) {
    if (!is_int(j[mt])) throw bad(std::string("'") + mt + "' must be an integer", mt);
    if (j[mt].is_number_integer() && j[mt].get<int64_t>() < 1)
      throw bad(std::string("'") + mt + "' must be >= 1, got " + std::to_string(j[mt].get<int64_t>()), mt);
    const uint64_t v = j[mt].get<uint64_t>();
    if (v > static_cast<uint64_t>(ctx) || n_prompt + static_cast<int64_t>(v) > ctx)
      throw bad("This model's maximum context length is " + std::to_string(ctx) + " tokens. However, you requested " +
                    std::to_string(n_prompt + v) + " tokens (" + std::to_string(n_prompt) + " in the prompt, " +
                    std::to_string(v) + " for the completion). Please reduce the prompt or the completion.",
                mt, "context_length_exceeded");
    p.gen.max_tokens = static_cast<int>(v);
  } else {
    p.gen.max_tokens = chat ? ctx - n_prompt : std::min(16, ctx - n_prompt);
  }
  if (n_prompt >= ctx)
    throw bad("This model's maximum context length is " + std::to_string(ctx) + " tokens. However, your prompt is " +
                  std::to_string(n_prompt) + " tokens, leaving no room for the completion.",
              chat ? "messages" : "prompt", "context_length_exceeded");
  return p;
}

void Server::completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  const std::string endpoint = chat ? "chat_completions" : "completions";
  const auto t0 = Clock::now();
  Parsed p;
  try {
    if (draining_) throw ApiError{503, "the server is shutting down", "server_error", "", "unavailable"};
    p = parse(req.body, chat);
  } catch (const ApiError& e) {
    send_error(res, e);
    if (e.status == 503) res.set_header("Retry-After", "5");
    count(endpoint, res.status);
    return;
  }
  auto r = std::make_shared<Request>(std::move(p.prompt), std::move(p.gen));
  switch (sched_.submit(r)) {
    case Scheduler::Admit::ok: break;
    case Scheduler::Admit::queue_full:
      send_error(res, {503, "all slots are busy and the queue is full; retry later", "server_error", "", "queue_full"});
      res.set_header("Retry-After", "1");
      count(endpoint, 503);
      return;
    case Scheduler::Admit::too_big:
      send_error(res, bad("the request needs " + std::to_string(sched_.reserve_bytes(static_cast<int>(r->prompt.size()) + r->params.max_tokens)) +
                              " bytes of KV cache, more than the whole --kv-budget of " +
                              std::to_string(sched_.options().kv_budget) + " bytes; lower max_tokens",
                          "max_tokens", "kv_budget_exceeded"));
      count(endpoint, 400);
      return;
    case Scheduler::Admit::draining:
      send_error(res, {503, "the server is shutting down", "server_error", "", "unavailable"});
      res.set_header("Retry-After", "5");
      count(endpoint, 503);
      return;
  }
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  auto usage = [](const Event& e) {
    return json{{"prompt_tokens", e.prompt_tokens}, {"completion_tokens", e.completion_tokens},
                {"total_tokens", e.prompt_tokens + e.completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", e.cached_tokens}}}};
  };
  if (!p.stream) {
    std::string text;
    Event last;
    bool first = true;
    for (bool done = false; !done;) {
      std::vector<Event> evs;
      r->wait(evs, std::chrono::milliseconds(200));
      for (auto& e : evs) {
        if (first) {
          std::lock_guard<std::mutex> lk(metrics_.mu);
          metrics_.ttft.observe(std::chrono::duration<double>(Clock::now() - t0).count());
          first = false;
        }
        text += e.text;
        if (e.done) {
          last = e;
          done = true;
        }
      }
    }
    if (!last.error.empty()) {
      send_error(res, {500, last.error, "server_error", "", ""});
      count(endpoint, 500);
      return;
    }
    if (chat) remember(text, last);
    json choice = {{"index", 0}, {"finish_reason", last.finish_reason}};
    if (chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
    else {
      choice["text"] = text;
      choice["logprobs"] = nullptr;
    }
    json out = {{"id", id}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created},
                {"model", so_.model_id}, {"choices", json::array({choice})}, {"usage", usage(last)}};
    res.set_content(dump(out), "application/json");
    count(endpoint, 200);
    std::lock_guard<std::mutex> lk(metrics_.mu);
    metrics_.latency.observe(std::chrono::duration<double>(Clock::now() - t0).count());
    return;
  }
  // Streaming: server-sent events, one chunk per piece of text, then the finish chunk, the usage
  // chunk when asked for, and [DONE]. A failed write (client gone) cancels the request, which
  // frees its slot at the scheduler's next step; so does a response dropped unfinished.
  struct StreamState {
    std::shared_ptr<Request> r;
    bool done = false, first = true;
    std::string text;
    ~StreamState() {
      if (!done) r->cancelled = true;
    }
  };
  auto st = std::make_shared<StreamState>();
  st->r = r;
  {
    std::lock_guard<std::mutex> lk(streams_mu_);
    ++open_streams_;
  }
  const bool include_usage = p.include_usage;
  count(endpoint, 200);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st, chat, id, created, include_usage, usage, t0](size_t, httplib::DataSink& sink) {
        auto chunk = [&](const json& delta_or_text, const json& finish) {
          json choice = {{"index", 0}, {"finish_reason", finish}};
          if (chat) choice["delta"] = delta_or_text;
          else {
            choice["text"] = delta_or_text;
            choice["logprobs"] = nullptr;
          }
          json c = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                    {"model", so_.model_id}, {"choices", json::array({choice})}};
          return "data: " + dump(c) + "\n\n";
        };
        std::vector<Event> evs;
        st->r->wait(evs, std::chrono::milliseconds(200));
        std::string out;
        if (st->first && chat) out += chunk({{"role", "assistant"}, {"content", ""}}, nullptr);
        for (auto& e : evs) {
          if (st->first) {
            st->first = false;
            std::lock_guard<std::mutex> lk(metrics_.mu);
            metrics_.ttft.observe(std::chrono::duration<double>(Clock::now() - t0).count());
          }
          if (!e.text.empty()) out += chunk(chat ? json{{"content", e.text}} : json(e.text), nullptr);
          st->text += e.text;
          if (e.done) {
            st->done = true;
            if (chat) remember(st->text, e);
            if (!e.error.empty()) {
              out += "data: " + dump({{"error", {{"message", e.error}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}}) + "\n\n";
            } else {
              out += chunk(chat ? json::object() : json(""), e.finish_reason);
              if (include_usage) {
                json u = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"},
                          {"created", created}, {"model", so_.model_id}, {"choices", json::array()}, {"usage", usage(e)}};
                out += "data: " + dump(u) + "\n\n";
              }
            }
            out += "data: [DONE]\n\n";
          }
        }
        if (chat && st->first && evs.empty()) out.clear();  // role chunk goes with the first text
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          st->r->cancelled = true;
          return false;
        }
        if (st->done) {
          sink.done();
          std::lock_guard<std::mutex> lk(metrics_.mu);
          metrics_.latency.observe(std::chrono::duration<double>(Clock::now() - t0).count());
        }
        return true;
      },
      [this, st](bool success) {
        if (!success || !st->done) st->r->cancelled = true;
        std::lock_guard<std::mutex> lk(streams_mu_);
        --open_streams_;
        streams_cv_.notify_all();
      });
}

std::string Server::metrics_text() {
  const SchedulerStats s = sched_.stats();
  std::string out;
  auto gauge = [&](const char* name, const char* type, const char* help, double v) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
    out += buf;
  };
  {
    std::lock_guard<std::mutex> lk(metrics_.mu);
    out += "# HELP tq_requests_total HTTP requests by endpoint and status code\n# TYPE tq_requests_total counter\n";
    for (const auto& [k, n] : metrics_.requests)
      out += "tq_requests_total{endpoint=\"" + k.first + "\",code=\"" + std::to_string(k.second) + "\"} " +
             std::to_string(n) + "\n";
    metrics_.ttft.write(out, "tq_time_to_first_token_seconds", "time from request to its first output");
    metrics_.latency.write(out, "tq_request_duration_seconds", "time from request to its last output");
  }
  gauge("tq_prompt_tokens_total", "counter", "prompt tokens of finished requests", s.prompt_tokens);
  gauge("tq_prompt_tokens_cached_total", "counter", "prompt tokens reused from a slot's cache (prefix reuse)", s.cached_prompt_tokens);
  gauge("tq_completion_tokens_total", "counter", "generated tokens of finished requests", s.completion_tokens);
  gauge("tq_decode_steps_total", "counter", "batched decode forwards", s.decode_steps);
  gauge("tq_decode_rows_total", "counter", "sequence rows over all batched decode forwards", s.decode_rows);
  gauge("tq_requests_cancelled_total", "counter", "requests whose client went away", s.cancelled);
  gauge("tq_active_conversations", "gauge", "requests holding a slot", s.active);
  gauge("tq_queue_depth", "gauge", "requests waiting for a slot", s.queued);
  gauge("tq_slots", "gauge", "slots (--parallel)", s.slots);
  gauge("tq_kv_bytes_held", "gauge", "KV cache bytes held by all slots", static_cast<double>(s.kv_bytes_held));
  gauge("tq_kv_bytes_reserved", "gauge", "KV bytes reserved by admitted requests", static_cast<double>(s.kv_bytes_reserved));
  gauge("tq_kv_budget_bytes", "gauge", "--kv-budget (0: none)", static_cast<double>(s.kv_budget));
  gauge("tq_kv_bytes_per_token", "gauge", "KV bytes per cached token (quantized)", sched_.kv_bytes_per_token());
  return out;
}

int Server::run() {
  const SchedulerOptions& o = sched_.options();
  const int threads = so_.http_threads > 0 ? so_.http_threads : o.parallel + o.queue_max + 8;
  svr_.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  svr_.set_payload_max_length(so_.max_body);
  svr_.set_keep_alive_timeout(5);
  svr_.set_read_timeout(30);
  svr_.set_write_timeout(30);
  svr_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (so_.api_key.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (req.path.rfind("/v1/", 0) != 0 && req.path != "/metrics") return httplib::Server::HandlerResponse::Unhandled;
    const std::string want = "Bearer " + so_.api_key;
    const std::string got = req.get_header_value("Authorization");
    unsigned diff = got.size() != want.size();
    for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned>(want[i] ^ (i < got.size() ? got[i] : 0));
    if (diff == 0) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, {401, "Incorrect or missing API key: send 'Authorization: Bearer KEY'", "invalid_request_error", "",
                     "invalid_api_key"});
    count("auth", 401);
    return httplib::Server::HandlerResponse::Handled;
  });
  svr_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg = "HTTP " + std::to_string(res.status);
    if (res.status == 404) msg = "no route for " + req.method + " " + req.path;
    if (res.status == 413) msg = "the request body is larger than the limit (--max-body)";
    if (res.status == 405) msg = "method " + req.method + " not allowed on " + req.path;
    send_error(res, {res.status, msg, "invalid_request_error", "", ""});
  });
  svr_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    send_error(res, {500, msg, "server_error", "", ""});
  });
  svr_.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { completion(q, r, true); });
  svr_.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { completion(q, r, false); });
  svr_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", so_.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "turboquant"}};
    res.set_content(dump({{"object", "list"}, {"data", json::array({m})}}), "application/json");
    count("models", 200);
  });
  svr_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const SchedulerStats s = sched_.stats();
    res.status = draining_ ? 503 : 200;
    res.set_content(dump({{"status", draining_ ? "draining" : "ok"}, {"slots", s.slots}, {"active", s.active},
                          {"queued", s.queued}}),
                    "application/json");
  });
  svr_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  svr_.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(kChatPage, "text/html; charset=utf-8"); });

  int port = so_.port;
  if (port == 0) {
    port = svr_.bind_to_any_port(so_.host);
    TQ_CHECK(port > 0, "serve: cannot bind %s on any port", so_.host.c_str());
  } else {
    TQ_CHECK(svr_.bind_to_port(so_.host, port), "serve: cannot bind %s:%d", so_.host.c_str(), port);
  }
  // SIGTERM / SIGINT: the handler (any thread may run it) writes to a pipe; this thread reads
  // it, stops admitting, lets the admitted and queued requests finish, then stops the server.
  std::thread sig([this] {
    char c = 0;
    while (read(g_sig_pipe[0], &c, 1) < 0 && errno == EINTR) {
    }
    if (c == 'q') return;  // listen failed
    std::fprintf(stderr, "tq serve: signal %d, draining\n", static_cast<int>(c));
    draining_ = true;
    sched_.drain();
    {  // the last events of a finished request may still be on their way to the client
      std::unique_lock<std::mutex> lk(streams_mu_);
      streams_cv_.wait(lk, [this] { return open_streams_ == 0; });
    }
    svr_.stop();
  });
  std::fprintf(stderr, "tq serve: listening on http://%s:%d (model %s, %d slots, ctx %d)\n", so_.host.c_str(), port,
               so_.model_id.c_str(), o.parallel, o.ctx);
  std::fflush(stderr);
  const bool ok = svr_.listen_after_bind();
  if (!draining_) {  // listen failed: end the signal thread
    const char q = 'q';
    (void)!write(g_sig_pipe[1], &q, 1);
  }
  sig.join();
  std::fprintf(stderr, "tq serve: stopped\n");
  return ok ? 0 : 1;
}

}  // namespace

int run_server(const ServerOptions& so, const LlamaModel& model, const Tokenizer& tok, const KvSpec& kv,
               const SchedulerOptions& sched) {
  TQ_CHECK(pipe(g_sig_pipe) == 0, "serve: pipe() failed");
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a signal
  Scheduler s(model, tok, kv, sched);
  Server srv(so, model, tok, s);
  return srv.run();
}

}  // namespace tq::serve
