// SIMD level control on top of Highway's dynamic dispatch (see include/tq/simd.h).
#include "tq/simd.h"

#include <hwy/highway.h>
#include <hwy/targets.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include "tq/error.h"

namespace tq::simd {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct State {
  std::mutex mu;
  std::vector<std::pair<std::string, int64_t>> targets;  // best first, as found at start-up
  std::atomic<bool> scalar{false};
  std::string level = "auto";
};

void apply_locked(State& st, const std::string& level);

State& state() {
  static State* st = [] {
    auto* s = new State;
    for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
      // Highway's own portable fallbacks are not levels of ours: "scalar" means the `_ref`
      // reference kernels (listed once, last, by available_levels()).
      std::string name = lower(hwy::TargetName(t));
      if (name == "scalar" || name == "emu128") continue;
      s->targets.emplace_back(std::move(name), t);
    }
    if (const char* env = std::getenv("TQ_SIMD"); env && *env) {
      try {
        apply_locked(*s, lower(env));
      } catch (const Error& e) {
        std::fprintf(stderr, "tq: warning: ignoring TQ_SIMD: %s\n", e.what());
      }
    }
    return s;
  }();
  return *st;
}

// Highway's supported switch: hwy::DisableTargets(mask) takes the masked targets out of
// SupportedTargets() and resets the dispatch cache (the next HWY_DYNAMIC_DISPATCH picks again).
// That next pick is not safe to make from several threads at once (Highway 1.0.3): it runs
// SupportedTargets(), which first publishes every detected target as the chosen one and only
// then the masked set, so another thread dispatching in between ran a better level's kernel
// (the sliding-window test saw KV caches built partly with AVX-512 code while sse4 was set, one
// process in ten). So the pick is made here, on the calling thread, before this returns.
// A level keeps its own target and every worse one: it disables the better ones, whose bits are
// the lower ones (Highway numbers targets best first within an architecture).
void apply_locked(State& st, const std::string& level) {
  if (level == "auto" || level == "scalar") {
    hwy::DisableTargets(0);
    st.scalar = level == "scalar";
  } else {
    auto it = std::find_if(st.targets.begin(), st.targets.end(), [&](auto& p) { return p.first == level; });
    if (it == st.targets.end()) {
      std::string valid = "auto";
      for (auto& p : st.targets) valid += ", " + p.first;
      valid += ", scalar";
      TQ_CHECK(false, "unknown or unsupported SIMD level '%s' (valid here: %s)", level.c_str(), valid.c_str());
    }
    hwy::DisableTargets(it->second - 1);
    st.scalar = false;
  }
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  st.level = level;
}

}  // namespace

std::vector<std::string> available_levels() {
  State& st = state();
  std::vector<std::string> out;
  for (auto& p : st.targets) out.push_back(p.first);
  out.push_back("scalar");
  return out;
}

void set_level(const std::string& level) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  apply_locked(st, lower(level));
}

std::string current_level() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.scalar) return "scalar";
  if (st.level != "auto") return st.level;
  return st.targets.empty() ? "scalar" : st.targets.front().first;
}

extern "C" char* openblas_get_corename(void);
const char* blas_core() noexcept {
  const char* c = openblas_get_corename();
  return c ? c : "";
}

bool use_scalar() noexcept { return state().scalar.load(std::memory_order_relaxed); }

ScopedLevel::ScopedLevel(const std::string& level) {
  {
    State& st = state();
    std::lock_guard<std::mutex> lock(st.mu);
    prev_ = st.scalar ? "scalar" : st.level;
  }
  set_level(level);
}
ScopedLevel::~ScopedLevel() {
  try {
    set_level(prev_);
  } catch (...) {
  }
}

}  // namespace tq::simd
