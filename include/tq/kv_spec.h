// One KV cache choice as a value: the K and V formats, window, sink and centring protection,
// K scaling, trellis codes, boundary layers and per-layer / per-head types. Every front end
// reads it from the one grammar below (the -ctk / --kv-* flags become its tokens, --sweep /
// --caches entries and --kv-config files are labels, `bench attention` and `tq calibrate`
// build it) and resolve() maps it onto a cache of a given shape.
//
// Grammar: whitespace-separated tokens, later tokens overriding earlier ones (layer rules add up):
//   k=T  v=T  T[/T]          K and V formats (a bare T sets both, T/T K then V)
//   auto                     K and V (the generic recommendation) chosen from what the model is
//                            (kv_model_defaults); not with k= / v= / T[/T]
//   window=N                 most recent N tokens kept in f16
//   sink=N                   first N tokens kept in f16 for good
//   center=ITEM[,ITEM...]    k | v | kv | none: which side is mean-centred; rope: the K mean
//                            rotates with RoPE; N: one mean per N quantized tokens
//   plain                    no automatic protection (see Protection)
//   scale-k  trellis         query-weighted K scaling; trellis-coded tq codes
//   boundary=N[:T[/T]]  boundary=T[/T]   first and last N layers use these types
//   layers=LIST:T[/T]        LIST of layers "0,3,10-12" and LAYER.HEAD items "5.1"
//   seed=N                   seed of the rotations
// e.g. "k=tq3h6 v=tq4n8 sink=1 center=k,rope,512 scale-k". The short forms of earlier
// releases parse to the same cache: "tq4/tq3 w128 s4 ckv cs512 cr ks tc plain b2:f16 L5:tq6".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tq/kv_cache.h"

namespace tq {

struct LlamaConfig;

// Sinks and centring of a cache.
enum class Protection : uint8_t {
  automatic,  // a TurboQuant K format gets kAutoSink f16 sink token and K centring with one
              // RoPE-rotating mean per kAutoSegment tokens, plus what kv_model_defaults says
              // for the model (scale-k for QK-normed keys); other K formats: none
  given,      // sink / center_* / center_segment / center_rope as written
  none,       // no sink, no centring ("plain")
};

// One entry of layers=: whole layers first..last, or one KV head of one layer.
struct KvLayerItem {
  int first = 0, last = 0;
  std::optional<int> head;
  bool operator==(const KvLayerItem&) const = default;
};
struct KvLayerRule {
  std::vector<KvLayerItem> items;
  KvFormat k = KvFormat::f16, v = KvFormat::f16;
  bool operator==(const KvLayerRule&) const = default;
  std::string to_string() const;  // "0,3,10-12,5.1:tq6/tq3"
};

// What a spec's automatic parts become on one model, chosen from what the model is (its
// properties, never its name): the generic recommendation `auto` and the protection a tq K
// type gets on top of the sink and centring. docs/design.md, "Defaults from model properties".
struct KvModelDefaults {
  KvFormat k, v;     // `auto`
  bool scale_k;      // the automatic protection adds scale-k
  const char* rule;  // which property chose them, for the JSON: "qk-norm" or "default"
};
KvModelDefaults kv_model_defaults(const LlamaConfig& model);

struct KvSpec {
  KvFormat k = KvFormat::f16, v = KvFormat::f16;
  bool auto_types = false;   // "auto": k and v from kv_model_defaults (k / v unused until resolved)
  int window = 0;
  Protection protection = Protection::automatic;
  int sink = 0;              // given: first tokens kept in f16
  bool center_k = false;     // given: per-stream mean centring
  bool center_v = false;
  bool center_rope = false;  // given: the K mean rotates with RoPE (needs center_k)
  int center_segment = 0;    // given: one mean per N quantized tokens (0: one mean)
  bool scale_k = false;
  bool trellis = false;
  int boundary_layers = 0;
  KvFormat boundary_k = KvFormat::f16, boundary_v = KvFormat::f16;
  std::vector<KvLayerRule> layers;
  uint64_t seed = kDefaultSeed;

  static constexpr int kAutoSink = 1;
  static constexpr int kAutoSegment = 512;
  static constexpr uint64_t kDefaultSeed = 0x5eed;

  // A label in the grammar above (or a concatenation of labels: later tokens override).
  // Bad tokens: a one-line tq::Error naming the token; removed types and forms: a tq::Error
  // saying what to use instead.
  static KvSpec parse(const std::string& label);
  // The readable label; parse(to_string()) == *this for every value parse returns.
  std::string to_string() const;
  // One JSON object (text): the resolved fields, "auto_protected" and "label" (resolved()).
  std::string to_json() const;
  // The same for what the spec becomes on `model` (resolved(model)), with "spec" (this spec's
  // own label, as asked) and "model_rule" (kv_model_defaults(model).rule).
  std::string to_json(const LlamaConfig& model) const;
  // The automatic protection applies (automatic, TurboQuant K format or auto).
  bool auto_protected() const;
  // The automatic protection spelled out (given), every other value in its canonical form.
  // `auto` stays as it is (its types need a model).
  KvSpec resolved() const;
  // What the spec is on this model: `auto` replaced by the model's types, the automatic
  // protection spelled out with what kv_model_defaults(model) adds. resolve(model, n) builds
  // exactly this; the model commands print its label.
  KvSpec resolved(const LlamaConfig& model) const;
  // The cache config on a cache of this shape (n_layers, n_kv_heads, head_dim, max_tokens,
  // rope_base, rope_dim from `shape`); layer rules out of range are a tq::Error, and so is
  // `auto` (which needs a model). No model-dependent defaults.
  KvCacheConfig resolve(const KvCacheConfig& shape) const;
  // resolved(model).resolve(the model's cache shape).
  KvCacheConfig resolve(const LlamaConfig& model, int max_tokens) const;
  bool operator==(const KvSpec&) const = default;
};

// Every KvFormat the spec names (K, V, boundary, layer rules), in order, repeats included.
std::vector<KvFormat> kv_spec_formats(const KvSpec& s);
const char* kv_format_name(KvFormat f);
// A format by name (parse_kv_type's errors).
KvFormat parse_kv_format(const std::string& name);

// Why the label's ck:N (--kv-center-tokens) was removed and what to use instead.
extern const char* const kRemovedCenterTokens;
// A label for messages and text output: past `max` characters its start and "..." (a
// per-KV-head allocation's label is a thousand characters long).
std::string short_label(const std::string& label, size_t max = 48);
// Reads a cache config file: one label, split over any number of lines, '#' starting a
// comment to the end of its line (e.g. a per-head allocation fitted to one model,
// configs/*.kv). Throws on an unreadable file or one that holds no label.
std::string read_kv_label_file(const std::string& path);
// A label, or "@PATH" for a cache config file.
KvSpec parse_kv_spec_or_file(const std::string& label_or_file);

}  // namespace tq
