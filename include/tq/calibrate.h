// Fitting a per-KV-head cache allocation to a model (`tq calibrate`): measure how much each KV
// head's K and V add to the output error when quantized alone, and what each candidate type
// costs the whole model, then give every head the K and V types that minimize the predicted
// KLD within a bit budget counted as the cache counts it.
//
// The method (docs/design.md, "Calibrated per-KV-head allocation"):
//  1. On calibration text, for every window: one f16 reference pass, then one pass per probe
//     config (perplexity_multi, all sharing the reference): each KV head's K alone at probe_k
//     (everything else f16), each head's V alone at probe_v, and every candidate type on one
//     whole side (K at type t, V f16; K f16, V at t). KLD against the reference, averaged over
//     the scored tokens of all windows.
//  2. Head u's side s at type t is predicted to cost share_s(u) x KLD_s(t), share_s(u) the
//     head's fraction of the side's summed one-head KLDs; heads add. A multiple-choice
//     knapsack (one type per head and side) minimizes the sum within the budget.
// The same as bench/kv_layer_plan.py `sweep --heads N` then `alloc`, in one command.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tq/eval.h"
#include "tq/model.h"

namespace tq {

// One option of a multiple-choice knapsack group: its value (to minimize) and integer cost.
struct McOption {
  double value = 0;
  int64_t cost = 0;
};
// Picks one option per group minimizing the summed value with the summed cost <= cap (exact
// dynamic program over the cost above each group's cheapest option; memory groups x that
// range). Ties: the earlier option of a group, then the smaller total cost. Returns the index
// picked in each group and sets *value / *cost when given; tq::Error when even the cheapest
// options exceed cap, or when the table (groups x cost range) would exceed 2^28 entries.
std::vector<int> solve_mckp(const std::vector<std::vector<McOption>>& groups, int64_t cap,
                            double* value = nullptr, int64_t* cost = nullptr);

// Inputs of the allocation: units are KV heads (layer l, head h in order l * n_kv_heads + h).
struct AllocInput {
  int n_layers = 0, n_kv_heads = 0;
  std::vector<double> sens_k, sens_v;        // one-head KLD of each unit's K (V) alone
  std::vector<std::string> k_types, v_types; // candidate types of each side
  std::vector<double> kld_k, kld_v;          // whole-model KLD of each candidate (one side quantized)
  std::vector<int64_t> cost_k, cost_v;       // cost of one unit at each candidate (integer units)
  int64_t budget = 0;                        // summed cost of all units, K and V, at most this
  std::string suffix;                        // appended to the base K/V of the label, e.g. " ks"
  // Further measurements of the same units and types (e.g. at other contexts): with them a unit's
  // value at type t is the weighted sum over all measurements (the one above with `weight`) of
  // share(u) x kld(t). Empty: the one measurement above, unweighted.
  struct Measure {
    std::vector<double> sens_k, sens_v, kld_k, kld_v;
    double weight = 1;
  };
  std::vector<Measure> more;
  double weight = 1;
  // A unit's cost at type t is cost x unit_scale[u] (e.g. the tokens its layer holds, in units of
  // the fewest any layer holds); empty: x 1.
  std::vector<int64_t> unit_scale;
};
struct AllocResult {
  std::string label;                         // "k=K v=V<suffix> layers=UNITS:K/V ..." (KvSpec::to_string)
  std::vector<std::string> k_type, v_type;   // the type of each unit
  double predicted_kld = 0;                  // the minimized sum (weighted when `more` is given)
  std::vector<double> predicted_each;        // with `more`: the unweighted predicted KLD of each
                                             // measurement, the first one's first
  int64_t cost = 0;                          // summed cost
};
// The knapsack above and the label: base K (V) = the type most units take (ties: the cheaper),
// then one layers= rule per distinct (K, V) pair of the other units, in order of first appearance;
// units are named "l.h" ("l" when the model has one KV head per layer).
AllocResult allocate_heads(const AllocInput& in);

// The candidate types of `tq calibrate` (the ones the SmolLM2 allocations used), before
// filtering by head_dim.
std::vector<std::string> default_calib_k_types();
std::vector<std::string> default_calib_v_types();

struct CalibOptions {
  int n_ctx = 512;
  int n_chunks = 8;                          // windows of calibration text (fewer if it is short)
  std::vector<std::string> k_types, v_types; // empty: the defaults the model's head_dim supports
  std::string probe_k = "tq2h5n8", probe_v = "tq3n8";
  std::string protect = "ks";                // label tokens after the base K/V (the protection)
  uint64_t seed = 0x5eed;                    // cache rotations
  // Layers whose KV heads get the one-head probes (nullopt: every layer). The other units'
  // sensitivities are left at -1 for calib_reuse_sens to fill from a shorter context.
  std::optional<std::vector<int>> probe_layers;
  ProgressFn progress;                       // (done, total) passes
  std::function<bool()> stop;                // polled after every pass: true stops at the last whole window
};

// What step 1 measures (saved by `tq calibrate --save-sens`, reused with --sens).
struct CalibSensitivity {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0;
  int n_ctx = 0, windows = 0, windows_requested = 0;
  size_t n_scored = 0;
  std::string probe_k, probe_v, protect;
  std::vector<double> sens_k, sens_v;        // n_layers * n_kv_heads
  std::vector<std::string> k_types, v_types;
  std::vector<double> kld_k, kld_v;
  double ppl_ref = 0;
  double seconds = 0;
  // Layers whose sensitivities were not probed at n_ctx but copied from the measurement at
  // reused_from_ctx (calib_reuse_sens); empty: every layer was probed here.
  std::vector<int> reused_layers;
  int reused_from_ctx = 0;
  bool complete() const { return windows > 0 && windows == windows_requested; }
};

// The protection of every cache calibrate measures or writes: `protect` resolved on a tq K
// type (so the automatic sink / centring is spelled out), as a KvSpec of f16 types.
KvSpec calib_protection(const std::string& protect, uint64_t seed);
// The probe and type configs of step 1, in the order sens_k, sens_v, kld_k, kld_v.
std::vector<KvSpec> calib_configs(const LlamaConfig& mc, const CalibOptions& opt,
                                     const std::vector<std::string>& k_types,
                                     const std::vector<std::string>& v_types);
// Step 1 on `tokens` (windows of opt.n_ctx from the start). With opt.stop returning true it
// returns what the finished windows measured (windows < windows_requested; windows == 0 when
// none finished).
CalibSensitivity calibrate_measure(const LlamaModel& m, const std::vector<int32_t>& tokens,
                                   const CalibOptions& opt);

// The layers that attend to more tokens at long_ctx than at short_ctx: every layer of a model
// without sliding windows, only the global (non-windowed) ones when short_ctx already fills the
// windows (Gemma 3 at 512: layers 5, 11, 17). The others' one-head sensitivities change little
// with the context, so `tq calibrate --long-probes growing` probes only these at long_ctx.
std::vector<int> calib_layers_growing(const LlamaConfig& mc, int short_ctx, int long_ctx);
// Fills the units of `at_long` whose layers are not in `probed` with the one-head sensitivities
// of `at_short` (the same model, candidates, probes and protection, measured at a shorter
// context), as they are: a windowed layer's probe is a per-token KLD over the same number of
// attended tokens at both contexts. Records the layers and at_short.n_ctx (reused_layers,
// reused_from_ctx). tq::Error on a mismatch.
void calib_reuse_sens(CalibSensitivity& at_long, const CalibSensitivity& at_short, const std::vector<int>& probed);

// Bytes a cache of this label holds after n_ctx tokens (KvCache::bytes_used: quantized rows,
// f16 sink rows, centring means, K scales, channel masks), every layer holding every token
// (sliding-window layers hold fewer; this counts them in full). Filled with random keys,
// values and queries: nothing it counts depends on the values.
size_t calib_bytes_used(const LlamaConfig& mc, const KvSpec& kv, int n_ctx);
// The same, but as `tq perplexity` counts a window of n_ctx tokens: sliding-window layers drop
// what their window has left as the model's forward appends in batches of `ubatch` tokens
// (LlamaModel's default 512). Equal to calib_bytes_used when n_ctx <= every window.
size_t calib_bytes_held(const LlamaConfig& mc, const KvSpec& kv, int n_ctx, int ubatch = 512);

struct CalibAllocation {
  AllocResult alloc;
  double bits_all = 0;      // calib_bytes_used(label, n_ctx) per cached value, in bits
  size_t bytes_used = 0;
  int n_ctx = 0;
  double bits_cheapest = 0; // the cheapest candidate on every head, counted the same way
  // calibrate_allocate_multi: every context the budget was checked at (the smallest first), the
  // bits per value the allocation takes there (calib_bytes_held), and each measurement's
  // predicted KLD (alloc.predicted_each, in the order of the sensitivities given).
  std::vector<int> check_ctx;
  std::vector<double> check_bits;
};
// Bits per value, everything counted at n_ctx tokens (calib_bytes_used), of the cheapest
// candidates on every head: the least budget an allocation can meet.
double calib_cheapest_bits(const LlamaConfig& mc, const std::vector<std::string>& k_types,
                           const std::vector<std::string>& v_types, const std::string& protect, int n_ctx,
                           uint64_t seed = 0x5eed);
// Step 2: the allocation within `bits` per value with everything counted at n_ctx tokens
// (calib_bytes_used). The knapsack runs on per-token bytes (1/32 B units); the fixed part
// (sinks, means, scales) is measured and the cap lowered until the counted bits fit.
// tq::Error when bits is below what the cheapest candidates already take.
CalibAllocation calibrate_allocate(const LlamaConfig& mc, const CalibSensitivity& s, double bits, int n_ctx,
                                   uint64_t seed = 0x5eed);

// Step 2 on sensitivities measured at several contexts (e.g. 512 and 2048 on a model whose
// global layers see the whole context and the others a window): each unit's value at a type is
// the sum over the measurements of its predicted KLD there divided by that measurement's
// predicted KLD with the cheapest candidates everywhere (so each context counts alike, whatever
// its KLD scale), and the allocation keeps within `bits` at every measured context and at n_ctx,
// each counted as the cache holds it (calib_bytes_held). One measurement: calibrate_allocate.
// The measurements must share the model and the candidate types; tq::Error otherwise.
CalibAllocation calibrate_allocate_multi(const LlamaConfig& mc, const std::vector<CalibSensitivity>& s, double bits,
                                         int n_ctx, uint64_t seed = 0x5eed);

// Writes a --kv-config file: each of `comments` as a '#' line, then the label with one
// layers= rule per line. Written to a temporary file and renamed (never half a file); tq::Error when
// it cannot be written.
void write_kv_config_file(const std::string& path, const std::vector<std::string>& comments,
                          const std::string& label);

}  // namespace tq
