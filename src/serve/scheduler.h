// The scheduler of `tq serve`: owns N slots (each a KvCache and the tokens it holds), admits
// requests by KV bytes into free slots from a bounded FIFO queue, prefills one slot at a time in
// chunks and runs the decode steps of all decoding slots as one batched forward
// (LlamaModel::forward_batch: each weight read once per step for all of them). A request's
// tokens and text come back through its own event channel. No HTTP here (server.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tq/kv_spec.h"

#include "tq/eval.h"
#include "tq/model.h"
#include "tq/tokenizer.h"

namespace tq::serve {

struct GenParams {
  int max_tokens = 16;
  SamplerParams sampler;
  std::vector<std::string> stop;  // text stop sequences (not included in the output)
  bool ignore_eos = false;        // end-of-generation tokens do not end it (benchmarks)
};

// One piece of output: text (valid UTF-8, stop sequences cut), or the end.
struct Event {
  std::string text;
  bool done = false;
  std::string finish_reason;  // "stop" | "length" (done only)
  std::string error;          // non-empty: the request failed (done)
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  std::vector<int32_t> ids;    // done: the generated tokens (end-of-generation token excluded)
  bool cut = false;            // done: the text was cut at a stop sequence (ids hold more)
};

class Request {
 public:
  Request(std::vector<int32_t> prompt, GenParams p) : prompt(std::move(prompt)), params(std::move(p)) {}
  const std::vector<int32_t> prompt;
  const GenParams params;
  std::atomic<bool> cancelled{false};  // the client went away: the slot is freed at the next step
  // Blocks up to `timeout` for events; false on timeout with nothing new.
  bool wait(std::vector<Event>& out, std::chrono::milliseconds timeout);
  void push(Event e);
  std::chrono::steady_clock::time_point submitted = std::chrono::steady_clock::now();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> q_;
};

struct SchedulerOptions {
  int ctx = 2048;           // tokens per slot (prompt + completion)
  int parallel = 4;         // slots
  size_t kv_budget = 0;     // bytes of KV the admitted requests may reserve (0: no limit)
  int queue_max = 64;       // requests waiting for a slot beyond which submit() refuses
  int prefill_chunk = 256;  // prompt tokens per scheduler step (decode steps of others run between)
  bool prefix_reuse = true;
};

struct SchedulerStats {
  int active = 0, queued = 0, slots = 0;
  size_t kv_bytes_held = 0, kv_bytes_reserved = 0, kv_budget = 0;
  uint64_t prompt_tokens = 0, completion_tokens = 0, cached_prompt_tokens = 0, decode_steps = 0,
           decode_rows = 0, cancelled = 0;
};

class Scheduler {
 public:
  Scheduler(const LlamaModel& model, const Tokenizer& tok, const KvSpec& kv, const SchedulerOptions& opt);
  ~Scheduler();
  enum class Admit { ok, queue_full, too_big, draining };
  Admit submit(const std::shared_ptr<Request>& r);
  // KV bytes a request of n tokens (prompt + max_tokens) reserves.
  size_t reserve_bytes(int n_tokens) const;
  double kv_bytes_per_token() const { return bpt_; }
  // Stop admitting; returns when every admitted and queued request has finished.
  void drain();
  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return opt_; }

 private:
  struct Slot;
  void loop();
  void start_request(Slot& s);
  void after_logits(Slot& s, const float* logits);
  void finish(Slot& s, const std::string& reason, const std::string& error = "");
  void emit(Slot& s, bool final);

  const LlamaModel& model_;
  const Tokenizer& tok_;
  SchedulerOptions opt_;
  double bpt_ = 0;
  size_t overhead_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  size_t reserved_ = 0;
  int active_ = 0;
  bool draining_ = false, stop_ = false;
  SchedulerStats counters_;
  std::atomic<size_t> kv_held_{0};
  std::thread thread_;
};

}  // namespace tq::serve
