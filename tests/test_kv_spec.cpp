// Cache specs: every label spelling that configs/, the tests, the docs and the bench templates
// use resolves to the KvCacheConfig recorded in tests/kv_spec_golden.json (recorded with the
// parser these labels were written for, before KvSpec replaced it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tq/error.h"
#include "tq/eval.h"
#include "tq/kv_cache.h"

namespace {

// Every field of a KvCacheConfig a cache spec sets, one line.
std::string fingerprint(const tq::KvCacheConfig& c) {
  std::ostringstream s;
  auto list = [&](const char* name, const std::vector<std::string>& v) {
    s << ' ' << name << '=';
    for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  };
  s << "shape=" << c.n_layers << 'x' << c.n_kv_heads << 'x' << c.head_dim << " max=" << c.max_tokens
    << " k=" << c.type_k << " v=" << c.type_v << " window=" << c.window << " sink=" << c.sink
    << " ck=" << c.center_k << " cv=" << c.center_v
    << " seg=" << (c.center_k || c.center_v ? c.center_segment : 0) << " rope=" << c.center_rope
    << " rope_base=" << c.rope_base << " rope_dim=" << c.rope_dim << " ks=" << c.scale_k << " tc=" << c.trellis
    << " b=" << c.boundary_layers << ':' << c.boundary_type_k << '/' << c.boundary_type_v << " seed=" << c.seed;
  list("lk", c.layer_type_k);
  list("lv", c.layer_type_v);
  list("hk", c.head_type_k);
  list("hv", c.head_type_v);
  return s.str();
}

tq::KvCacheConfig shape_for(const std::string& label) {
  tq::KvCacheConfig s;
  const bool gemma = label.find("gemma3") != std::string::npos;
  s.n_layers = gemma ? 18 : 30;
  s.n_kv_heads = gemma ? 1 : 3;
  s.head_dim = gemma ? 256 : 64;
  s.max_tokens = 512;
  s.rope_base = gemma ? 1e6f : 1e5f;
  s.rope_dim = s.head_dim;
  return s;
}

// The old spellings: short forms of every token, configs/*.kv, labels from the docs.
const std::vector<std::string> kOldLabels = {
    "f16", "f32", "q8_0", "q4_0", "q4_0h", "q8_0h", "f16/f16", "f16/tq3", "f16/tq3n8", "f16/tq3h4",
    "tq3", "tq4", "tq2", "tq5", "tq8", "tq4/tq3", "tq5/tq3", "tq3h6/tq4n8", "tq3h6n8/tq4n8",
    "tq2h6n8/tq3n8 ks", "tq2h5n8/f16 ks", "q8_0/tq3 ckv", "tq3 plain", "tq4 plain", "tq5/tq3 plain",
    "tq3h6/tq4n8 plain", "tq3 s0", "tq3 c0", "tq3 cs256", "tq3 s0 cs256", "tq3 s4", "tq3 ck", "tq3 cv",
    "tq3 s1 ck", "tq3 plain s2 cv", "tq3 s1 ckv cr", "tq3 s1 ck cs256", "tq3 s1 ck cs512 cr",
    "tq4 s1 ck cs512", "tq5/tq3 s1 ck", "tq5/tq3 s1 ck cs512", "tq3h6/tq4n8 s1 ck cs512", "tq3h6/tq4n8 s1 ck",
    "tq3h6/tq4n8 ks", "tq3h6/tq4n8 cr", "tq3h6/tq4n8 s1 ck ks", "tq3h6/tq4n8 s1 ck cs256 ks",
    "tq3h6/tq4n8 s1 ck tc", "tq3h6/tq4n8 tc s1 ck ks", "tq3h6/tq4n8 s1 ck cs512 ks",
    "f16/tq4n8 s1 cv", "f16/tq4n8 s1 cv cs512", "tq3h6/tq4n8 s1 ckv cs512 cr ks",
    "tq4/tq2 w16 s4 ckv b1:f16", "tq4/tq3 w64 b1:f16", "tq3 w128 b2:f16", "tq4/tq3 w128 s4 ckv b2:f16 L5:tq6",
    "tq4/tq3 s1 ck L0,2-3:tq6/tq4n8 L3:f16", "tq4 plain L2.1,0.0:tq4/tq2", "tq3 b2:q8_0/f16",
    "tq4h6n8/tq4n8 ks L0.1,2.0:tq3h6n8/tq3n8 L5:tq6", "f16 s1 ck cs512 cr ks L0.0:tq2h5n8/f16",
    "f16 s1 ck cs512 cr ks L0.1:f16/tq3n8", "tq3h6n8/f16 s1 ck cs512 cr ks", "tq3h6n8/f16 ks plain",
    "tq3 tc", "tq2h4n8/tq3n8 ks tc", "tq3 w32 plain", "f16 cs256", "f16 s2", "q4_0 ck", "tq3 cr plain",
    "tq3 s1 cv cr", "f16 cr", "tq3 L0-29:q8_0", "tq3 L29.2:tq6/tq2",
    "@configs/smollm2-135m-kv4.25.kv", "@configs/smollm2-135m-kv3.25.kv", "@configs/gemma3-270m-kv4.25.kv",
    "@configs/gemma3-270m-kv3.25.kv",
};

std::string label_text(const std::string& label) {
  if (label[0] != '@') return label;
  return tq::read_kv_label_file(std::string(TQ_SOURCE_DIR) + "/" + label.substr(1));
}

// The config an old label resolves to, or "error".
std::string resolve_old(const std::string& label) {
  try {
    return fingerprint(tq::make_kv_config(shape_for(label), tq::parse_kv_label(label_text(label))));
  } catch (const tq::Error&) {
    return "error";
  }
}

}  // namespace

TEST(KvSpec, OldLabelsResolveToTheRecordedConfig) {
  const std::string path = std::string(TQ_SOURCE_DIR) + "/tests/kv_spec_golden.json";
  if (const char* w = std::getenv("TQ_WRITE_KV_SPEC_GOLDEN"); w && *w) {  // recorded once, with the old parser
    nlohmann::json j = nlohmann::json::object();
    for (const auto& l : kOldLabels) j[l] = resolve_old(l);
    std::ofstream(path) << j.dump(1) << "\n";
  }
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  const nlohmann::json golden = nlohmann::json::parse(f);
  ASSERT_EQ(golden.size(), kOldLabels.size());
  for (const auto& l : kOldLabels) EXPECT_EQ(resolve_old(l), golden.at(l).get<std::string>()) << l;
}
