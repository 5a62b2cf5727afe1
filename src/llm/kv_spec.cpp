// KvSpec: the one cache spec, its grammar (with the short forms of earlier releases) and its
// mapping onto a KvCacheConfig (include/tq/kv_spec.h).
#include "tq/kv_spec.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tq/error.h"
#include "tq/model.h"

namespace tq {

const char* kv_format_name(KvFormat f) { return kv_type_traits(kv_type(f)).name; }

KvFormat parse_kv_format(const std::string& name) { return static_cast<KvFormat>(parse_kv_type(name).id); }

namespace {

KvFormat format_of(const std::string& name) { return parse_kv_format(name); }
bool turboquant(KvFormat f) { return kv_type_traits(kv_type(f)).turboquant(); }
// The spec's K format is a TurboQuant one, or will be (`auto` always picks one).
bool tq_k(const KvSpec& s) { return s.auto_types || turboquant(s.k); }

std::string pair_name(KvFormat k, KvFormat v) {
  return k == v ? kv_format_name(k) : std::string(kv_format_name(k)) + "/" + kv_format_name(v);
}

constexpr const char* kGrammar =
    "k=T v=T T[/T] auto window=N sink=N center=k|v|kv|none[,rope][,N] plain scale-k trellis boundary=N[:T[/T]] "
    "layers=LIST:T[/T] seed=N";

// One spelling per cache: protection fields only where they act, boundary types only with
// boundary layers.
KvSpec canonical(KvSpec s) {
  if (s.auto_types) s.k = s.v = KvFormat::f16;  // unused until a model resolves them
  if (s.protection == Protection::given && s.sink == 0 && !s.center_k && !s.center_v && !s.center_rope)
    s.protection = Protection::none;
  if (s.protection == Protection::none && !tq_k(s)) s.protection = Protection::automatic;
  if (s.protection != Protection::given) {
    s.sink = 0;
    s.center_k = s.center_v = s.center_rope = false;
  }
  if (!s.center_k && !s.center_v) s.center_segment = 0;
  if (s.boundary_layers == 0) s.boundary_k = s.boundary_v = KvFormat::f16;
  return s;
}

// Reads the tokens of one label into a KvSpec; finish() applies the protection rules.
struct Parser {
  KvSpec s;
  std::string shown;  // the label, shortened, for errors
  std::string tok;    // the token being read
  bool given = false, plain = false, rope = false, first = true, types = false;
  std::optional<int> segment;

  [[noreturn]] void fail(const std::string& why) const {
    throw Error("cache spec '" + shown + "': '" + tok + "': " + why);
  }
  int number(const std::string& digits) const {
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos)
      fail("needs a number (0 to 999999999), got '" + digits + "'");
    return std::stoi(digits);
  }
  // "T" or "T/T" (a removed or unknown name: parse_kv_type's message).
  void pair(const std::string& text, KvFormat& k, KvFormat& v) const {
    const size_t sl = text.find('/');
    const std::string a = text.substr(0, sl), b = sl == std::string::npos ? a : text.substr(sl + 1);
    if (a.empty() || b.empty()) fail("expected a cache type or K/V types, e.g. tq4 or tq3h6/tq4n8");
    k = format_of(a);
    v = format_of(b);
  }
  void center_items(const std::string& list) {
    std::istringstream in(list);
    std::string it;
    bool any = false;
    while (std::getline(in, it, ',')) {
      any = true;
      if (it == "k" || it == "v" || it == "kv" || it == "none") {
        given = true;
        s.center_k = it == "k" || it == "kv";
        s.center_v = it == "v" || it == "kv";
      } else if (it == "rope") {
        rope = true;
      } else if (!it.empty() && it.find_first_not_of("0123456789") == std::string::npos) {
        segment = number(it);
      } else {
        fail("expected center=k|v|kv|none[,rope][,N], got '" + it + "'");
      }
    }
    if (!any || list.back() == ',') fail("expected center=k|v|kv|none[,rope][,N]");
  }
  void boundary(const std::string& text) {
    const size_t c = text.find(':');
    const std::string n = text.substr(0, c);
    if (c == std::string::npos && !n.empty() && n.find_first_not_of("0123456789") != std::string::npos) {
      pair(n, s.boundary_k, s.boundary_v);  // boundary=T[/T]
      return;
    }
    s.boundary_layers = number(n);
    if (c != std::string::npos) pair(text.substr(c + 1), s.boundary_k, s.boundary_v);
  }
  void layers(const std::string& spec) {
    const size_t colon = spec.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 >= spec.size())
      throw Error("layer types '" + spec + "': expected LAYERS:K[/V], e.g. 0,3,10-12:tq6/tq3 (LAYER.HEAD for one KV head)");
    const std::string list = spec.substr(0, colon), types = spec.substr(colon + 1);
    KvLayerRule r;
    {
      const size_t sl = types.find('/');
      const std::string a = types.substr(0, sl), b = sl == std::string::npos ? a : types.substr(sl + 1);
      if (a.empty() || b.empty()) throw Error("layer types '" + spec + "': empty cache type");
      r.k = format_of(a);
      r.v = format_of(b);
    }
    auto num = [&](const std::string& x, const char* what) {
      if (x.empty() || x.size() > 6 || x.find_first_not_of("0123456789") != std::string::npos)
        throw Error("layer types '" + spec + "': '" + x + "' is not a " + what + " number");
      return std::stoi(x);
    };
    if (list.back() == ',') throw Error("layer types '" + spec + "': empty layer list entry");
    std::istringstream in(list);
    std::string part;
    while (std::getline(in, part, ',')) {
      KvLayerItem item;
      const size_t dot = part.find('.');
      if (dot != std::string::npos) {
        item.first = item.last = num(part.substr(0, dot), "layer");
        item.head = num(part.substr(dot + 1), "KV head");
      } else {
        const size_t dash = part.find('-');
        item.first = num(part.substr(0, dash), "layer");
        item.last = dash == std::string::npos ? item.first : num(part.substr(dash + 1), "layer");
        if (item.first > item.last) throw Error("layer types '" + spec + "': empty range " + part);
      }
      r.items.push_back(item);
    }
    s.layers.push_back(std::move(r));
  }

  void token(const std::string& t) {
    tok = t;
    auto starts = [&](const char* p) { return t.rfind(p, 0) == 0; };
    auto all_digits_from = [&](size_t i) {
      return t.size() > i && t.find_first_not_of("0123456789", i) == std::string::npos;
    };
    const bool was_first = first;
    first = false;
    if (t == "auto") {
      s.auto_types = true;
    } else if (starts("k=")) {
      s.k = format_of(t.substr(2));
      types = true;
    } else if (starts("v=")) {
      s.v = format_of(t.substr(2));
      types = true;
    } else if (starts("window=")) {
      s.window = number(t.substr(7));
    } else if (starts("sink=")) {
      s.sink = number(t.substr(5));
      given = true;
    } else if (starts("center=")) {
      center_items(t.substr(7));
    } else if (t == "plain") {
      plain = true;
    } else if (t == "scale-k" || t == "ks") {
      s.scale_k = true;
    } else if (t == "trellis" || t == "tc") {
      s.trellis = true;
    } else if (starts("boundary=")) {
      boundary(t.substr(9));
    } else if (starts("layers=")) {
      layers(t.substr(7));
    } else if (starts("seed=")) {
      const std::string d = t.substr(5);
      if (d.empty() || d.size() > 19 || d.find_first_not_of("0123456789") != std::string::npos)
        fail("needs a number, got '" + d + "'");
      s.seed = std::stoull(d);
      // The short forms of earlier releases.
    } else if (t.size() > 1 && t[0] == 'w' && t.find('=') == std::string::npos) {
      s.window = number(t.substr(1));
    } else if (t.size() > 1 && t[0] == 's' && all_digits_from(1)) {
      s.sink = number(t.substr(1));
      given = true;
    } else if (starts("cs") && all_digits_from(2)) {
      segment = number(t.substr(2));
    } else if (t == "cr") {
      rope = true;
    } else if (t == "c0") {
      center_items("none");
    } else if (starts("ck") || starts("cv")) {
      const size_t c = t.find(':');
      const std::string w = t.substr(0, c);
      if (w != "ck" && w != "cv" && w != "ckv") fail("expected ck, cv or ckv");
      if (c != std::string::npos) fail(kRemovedCenterTokens);
      center_items(w.substr(1));
    } else if (t.size() > 1 && t[0] == 'b' && t.find(':') != std::string::npos) {
      const size_t c = t.find(':');
      s.boundary_layers = number(t.substr(1, c - 1));
      pair(t.substr(c + 1), s.boundary_k, s.boundary_v);
    } else if (t.size() > 1 && t[0] == 'L' && t.find(':') != std::string::npos) {
      layers(t.substr(1));
    } else if (was_first || t.find('/') != std::string::npos || find_kv_type(t)) {
      pair(t, s.k, s.v);  // T[/T]; an unknown or removed name fails here with its own message
      types = true;
    } else {
      fail(std::string("cannot parse (expected ") + kGrammar + ")");
    }
  }

  KvSpec finish() {
    if (s.auto_types && types) {
      tok = "auto";
      fail("chooses K and V from the model; give either 'auto' or the types (k=, v=, T[/T]), not both");
    }
    const bool tq = tq_k(s);
    if (given) {
      s.protection = Protection::given;
      s.center_rope = rope;
      s.center_segment = segment.value_or(0);
    } else if (plain) {
      s.protection = Protection::none;
      s.center_rope = rope;  // refused below: no K centring
    } else if (tq && segment) {
      // The automatic protection with its segment written out: spelled out in full.
      s.protection = Protection::given;
      s.sink = KvSpec::kAutoSink;
      s.center_k = true;
      s.center_rope = true;
      s.center_segment = *segment;
    } else {
      s.protection = Protection::automatic;
      s.center_rope = rope && !tq;  // cr is part of the automatic protection; elsewhere refused below
    }
    if (s.center_rope && !(s.protection == Protection::given && s.center_k))
      throw Error("--kv-center-rope (center=rope, label cr) needs K centring: --kv-center k or kv (center=k), or "
                  "a tq K type's automatic protection");
    return canonical(s);
  }
};

}  // namespace

const char* const kRemovedCenterTokens =
    "the centring token limit (ck:N, --kv-center-tokens) was removed (the mean of the first N tokens only lost to "
    "the mean of every token seen: tq3 KLD 0.066-0.084 vs 0.059); use ck (center=k), with csN (center=k,N) for a "
    "mean per N tokens";

std::string KvLayerRule::to_string() const {
  std::string s;
  for (const KvLayerItem& it : items) {
    if (!s.empty()) s += ",";
    s += std::to_string(it.first);
    if (it.head) s += "." + std::to_string(*it.head);
    else if (it.last != it.first) s += "-" + std::to_string(it.last);
  }
  return s + ":" + pair_name(k, v);
}

KvSpec KvSpec::parse(const std::string& label) {
  Parser p;
  p.shown = short_label(label, 72);
  std::istringstream in(label);
  std::string t;
  while (in >> t) p.token(t);
  TQ_CHECK(!p.first, "empty cache spec");
  return p.finish();
}

bool KvSpec::auto_protected() const {
  return protection == Protection::automatic && tq_k(*this);
}

// The one place where what a model is chooses cache defaults (docs/design.md, "Defaults from
// model properties"). Measured on SmolLM2-135M (no QK-norm, head_dim 64) and Gemma 3 270M
// (QK-norm, head_dim 256; BENCHMARKS.md "Gemma 3 270M: defaults from model properties"):
// scale-k on top of the automatic protection cut Gemma's tq3 / tq4 / tq3h6-tq4n8 KLD by 3x /
// 3x / 1.5x; SmolLM2's protection and recommendation stay as they were tuned.
KvModelDefaults kv_model_defaults(const LlamaConfig& model) {
  if (model.traits.qk_norm) return {KvFormat::tq4h6n8, KvFormat::tq3h6n8, true, "qk-norm"};
  return {KvFormat::tq3h6, KvFormat::tq4n8, false, "default"};
}

KvSpec KvSpec::resolved(const LlamaConfig& model) const {
  const KvModelDefaults d = kv_model_defaults(model);
  KvSpec s = *this;
  if (s.auto_types) {
    s.auto_types = false;
    s.k = d.k;
    s.v = d.v;
  }
  if (s.auto_protected() && d.scale_k) s.scale_k = true;
  return s.resolved();
}

KvSpec KvSpec::resolved() const {
  KvSpec r = *this;
  if (auto_types) return canonical(r);
  if (auto_protected()) {
    r.protection = Protection::given;
    r.sink = kAutoSink;
    r.center_k = true;
    r.center_v = false;
    r.center_rope = true;
    r.center_segment = kAutoSegment;
  }
  return canonical(r);
}

std::string KvSpec::to_string() const {
  std::string s = auto_types ? std::string("auto") : std::string("k=") + kv_format_name(k) + " v=" + kv_format_name(v);
  if (window > 0) s += " window=" + std::to_string(window);
  if (protection == Protection::given) {
    if (sink > 0) s += " sink=" + std::to_string(sink);
    if (center_k || center_v) {
      s += std::string(" center=") + (center_k ? "k" : "") + (center_v ? "v" : "");
      if (center_rope) s += ",rope";
      if (center_segment > 0) s += "," + std::to_string(center_segment);
    }
  } else if (protection == Protection::none && tq_k(*this)) {
    s += " plain";
  }
  if (scale_k) s += " scale-k";
  if (trellis) s += " trellis";
  if (boundary_layers > 0) s += " boundary=" + std::to_string(boundary_layers) + ":" + pair_name(boundary_k, boundary_v);
  for (const KvLayerRule& r : layers) s += " layers=" + r.to_string();
  if (seed != kDefaultSeed) s += " seed=" + std::to_string(seed);
  return s;
}

namespace {
nlohmann::json spec_json(const KvSpec& r, bool auto_protected) {
  std::vector<std::string> rules;
  for (const KvLayerRule& l : r.layers) rules.push_back(l.to_string());
  return {{"type_k", r.auto_types ? "auto" : kv_format_name(r.k)}, {"type_v", r.auto_types ? "auto" : kv_format_name(r.v)},
                            {"window", r.window}, {"sink", r.sink}, {"center_k", r.center_k},
                            {"center_v", r.center_v}, {"center_segment", r.center_segment},
                            {"center_rope", r.center_rope}, {"scale_k", r.scale_k}, {"trellis", r.trellis},
                            {"boundary_layers", r.boundary_layers}, {"boundary_type", kv_format_name(r.boundary_k)},
                            {"boundary_type_v", kv_format_name(r.boundary_v)}, {"layer_types", rules},
                            {"auto_protected", auto_protected}, {"seed", r.seed}, {"label", r.to_string()}};
}
}  // namespace

std::string KvSpec::to_json() const { return spec_json(resolved(), auto_protected()).dump(); }

std::string KvSpec::to_json(const LlamaConfig& model) const {
  nlohmann::json j = spec_json(resolved(model), auto_protected());
  j["spec"] = to_string();
  j["model_rule"] = kv_model_defaults(model).rule;
  return j.dump();
}

KvCacheConfig KvSpec::resolve(const KvCacheConfig& shape) const {
  TQ_CHECK(!auto_types, "cache spec 'auto' chooses its types from a model: use it with a model (-m MODEL), or give "
                        "the types (e.g. tq3h6/tq4n8)");
  const KvSpec r = resolved();
  TQ_CHECK(!r.center_rope || r.center_k,
           "--kv-center-rope (center=rope, label cr) needs K centring: --kv-center k or kv (center=k), or a tq K "
           "type's automatic protection");
  KvCacheConfig c = shape;
  c.type_k = r.k;
  c.type_v = r.v;
  c.window = r.window;
  c.sink = r.sink;
  c.center_k = r.center_k;
  c.center_v = r.center_v;
  c.center_segment = r.center_segment;
  c.center_rope = r.center_rope;
  c.scale_k = r.scale_k;
  c.trellis = r.trellis;
  c.boundary_layers = r.boundary_layers;
  c.boundary_type_k = r.boundary_k;
  c.boundary_type_v = r.boundary_v;
  c.seed = r.seed;
  const int n_layers = c.n_layers, n_heads = c.n_kv_heads;
  for (const KvLayerRule& rule : r.layers) {
    const std::string spec = rule.to_string();
    TQ_CHECK(n_layers >= 1 && n_heads >= 1, "layer types '%s': the cache has no layers", spec.c_str());
    auto in_range = [&](int i, const char* what, int n) {
      TQ_CHECK(i < n, "layer types '%s': %s %d out of range [0, %d]", spec.c_str(), what, i, n - 1);
    };
    for (const KvLayerItem& it : rule.items) {
      in_range(it.first, "layer", n_layers);
      in_range(it.last, "layer", n_layers);
      if (it.head) {
        in_range(*it.head, "KV head", n_heads);
        const size_t i = static_cast<size_t>(it.first) * n_heads + *it.head;
        c.head_type_k.resize(static_cast<size_t>(n_layers) * n_heads);
        c.head_type_v.resize(static_cast<size_t>(n_layers) * n_heads);
        c.head_type_k[i] = rule.k;
        c.head_type_v[i] = rule.v;
        continue;
      }
      c.layer_type_k.resize(n_layers);
      c.layer_type_v.resize(n_layers);
      for (int l = it.first; l <= it.last; ++l) {
        c.layer_type_k[l] = rule.k;
        c.layer_type_v[l] = rule.v;
      }
    }
  }
  return c;
}

KvCacheConfig KvSpec::resolve(const LlamaConfig& model, int max_tokens) const {
  return resolved(model).resolve(kv_config_for(model, max_tokens));
}

std::vector<KvFormat> kv_spec_formats(const KvSpec& s) {
  std::vector<KvFormat> f = {s.k, s.v};
  if (s.boundary_layers > 0) f.insert(f.end(), {s.boundary_k, s.boundary_v});
  for (const KvLayerRule& r : s.layers) f.insert(f.end(), {r.k, r.v});
  return f;
}

std::string short_label(const std::string& label, size_t max) {
  return label.size() > max ? label.substr(0, max - 3) + "..." : label;
}

std::string read_kv_label_file(const std::string& path) {
  std::error_code ec;
  TQ_CHECK(!std::filesystem::is_directory(path, ec), "cache config '%s' is a directory, not a file", path.c_str());
  std::ifstream f(path, std::ios::binary);
  TQ_CHECK(f.good(), "cannot read cache config '%s'", path.c_str());
  std::string label, line, tok;
  while (std::getline(f, line)) {
    TQ_CHECK(line.find('\0') == std::string::npos, "cache config '%s' is not a text file", path.c_str());
    std::istringstream words(line.substr(0, line.find('#')));
    while (words >> tok) label += (label.empty() ? "" : " ") + tok;
  }
  TQ_CHECK(!label.empty(), "cache config '%s' holds no cache label (only comments or blank lines)", path.c_str());
  return label;
}

KvSpec parse_kv_spec_or_file(const std::string& label) {
  if (label.empty() || label[0] != '@') return KvSpec::parse(label);
  const std::string path = label.substr(1);
  const std::string text = read_kv_label_file(path);
  try {
    return KvSpec::parse(text);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

}  // namespace tq
