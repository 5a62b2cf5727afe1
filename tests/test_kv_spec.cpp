// Cache specs: every label spelling that configs/, the tests, the docs and the bench templates
// use resolves to the KvCacheConfig recorded in tests/kv_spec_golden.json (recorded with the
// parser these labels were written for, before KvSpec replaced it).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tq/error.h"
#include "tq/eval.h"
#include "tq/kv_cache.h"
#include "tq/kv_spec.h"

namespace tq {
// gtest prints a spec by its label.
void PrintTo(const KvSpec& s, std::ostream* os) { *os << s.to_string() << " (protection " << int(s.protection) << ")"; }
}  // namespace tq

namespace {

// Every field of a KvCacheConfig a cache spec sets, one line.
std::string fingerprint(const tq::KvCacheConfig& c) {
  std::ostringstream s;
  auto list = [&](const char* name, const std::vector<std::optional<tq::KvFormat>>& v) {
    s << ' ' << name << '=';
    for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << (v[i] ? tq::kv_format_name(*v[i]) : "");
  };
  s << "shape=" << c.n_layers << 'x' << c.n_kv_heads << 'x' << c.head_dim << " max=" << c.max_tokens
    << " k=" << tq::kv_format_name(c.type_k) << " v=" << tq::kv_format_name(c.type_v) << " window=" << c.window << " sink=" << c.sink
    << " ck=" << c.center_k << " cv=" << c.center_v
    << " seg=" << (c.center_k || c.center_v ? c.center_segment : 0) << " rope=" << c.center_rope
    << " rope_base=" << c.rope_base << " rope_dim=" << c.rope_dim << " ks=" << c.scale_k << " tc=" << c.trellis
    << " b=" << c.boundary_layers << ':' << tq::kv_format_name(c.boundary_type_k) << '/' << tq::kv_format_name(c.boundary_type_v) << " seed=" << c.seed;
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
    "@configs/gemma3-270m-kv3.25.kv", "@bench/results/gemma/gemma3-270m-kv4.25-fit512.kv",
    "@bench/results/gemma/gemma3-270m-kv3.25-fit512.kv",
};

std::string label_text(const std::string& label) {
  if (label[0] != '@') return label;
  return tq::read_kv_label_file(std::string(TQ_SOURCE_DIR) + "/" + label.substr(1));
}

// The config a label resolves to with KvSpec, or "error".
std::string resolve_new(const std::string& label) {
  try {
    return fingerprint(tq::KvSpec::parse(label_text(label)).resolve(shape_for(label)));
  } catch (const tq::Error&) {
    return "error";
  }
}

}  // namespace

TEST(KvSpec, OldLabelsResolveToTheRecordedConfig) {
  const std::string path = std::string(TQ_SOURCE_DIR) + "/tests/kv_spec_golden.json";
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  const nlohmann::json golden = nlohmann::json::parse(f);
  ASSERT_EQ(golden.size(), kOldLabels.size());
  for (const auto& l : kOldLabels) EXPECT_EQ(resolve_new(l), golden.at(l).get<std::string>()) << l;
}

// parse(to_string(x)) == x, for every old label as parsed and as resolved, and the resolved
// spec names the same cache.
TEST(KvSpec, RoundTrip) {
  for (const auto& l : kOldLabels) {
    SCOPED_TRACE(l);
    tq::KvSpec s;
    try {
      s = tq::KvSpec::parse(label_text(l));
    } catch (const tq::Error&) {
      continue;  // the refused ones (cr without K centring)
    }
    EXPECT_EQ(tq::KvSpec::parse(s.to_string()), s) << s.to_string();
    const tq::KvSpec r = s.resolved();
    EXPECT_EQ(tq::KvSpec::parse(r.to_string()), r) << r.to_string();
    EXPECT_EQ(r.resolved(), r);
    EXPECT_EQ(fingerprint(r.resolve(shape_for(l))), fingerprint(s.resolve(shape_for(l))));
    EXPECT_EQ(fingerprint(tq::KvSpec::parse(r.to_string()).resolve(shape_for(l))), fingerprint(s.resolve(shape_for(l))));
  }
  // Values built field by field, including seeds and every protection.
  tq::KvSpec x;
  x.k = tq::KvFormat::tq3h6;
  x.v = tq::KvFormat::tq4n8;
  x.seed = 7;
  x.scale_k = x.trellis = true;
  x.window = 64;
  x.boundary_layers = 2;
  x.boundary_k = tq::KvFormat::q8_0;
  x.layers.push_back({{{0, 0, std::nullopt}, {3, 5, std::nullopt}, {7, 7, 1}}, tq::KvFormat::tq6, tq::KvFormat::f16});
  for (tq::Protection p : {tq::Protection::automatic, tq::Protection::given, tq::Protection::none}) {
    x.protection = p;
    const bool given = p == tq::Protection::given;  // the protection fields act only then
    x.sink = given ? 4 : 0;
    x.center_k = x.center_v = x.center_rope = given;
    x.center_segment = given ? 256 : 0;
    EXPECT_EQ(tq::KvSpec::parse(x.to_string()), x) << x.to_string();
  }
}

// The readable form of the short labels.
TEST(KvSpec, ReadableLabels) {
  struct Case {
    const char* in;
    const char* spec;      // to_string()
    const char* resolved;  // resolved().to_string()
  };
  for (const Case& c : std::vector<Case>{
           {"tq3", "k=tq3 v=tq3", "k=tq3 v=tq3 sink=1 center=k,rope,512"},
           {"f16", "k=f16 v=f16", "k=f16 v=f16"},
           {"tq3h6/tq4n8 s1 ck cs512 cr ks", "k=tq3h6 v=tq4n8 sink=1 center=k,rope,512 scale-k",
            "k=tq3h6 v=tq4n8 sink=1 center=k,rope,512 scale-k"},
           {"tq3h6/tq4n8 ks", "k=tq3h6 v=tq4n8 scale-k", "k=tq3h6 v=tq4n8 sink=1 center=k,rope,512 scale-k"},
           {"tq3 plain", "k=tq3 v=tq3 plain", "k=tq3 v=tq3 plain"},
           {"tq3 s0", "k=tq3 v=tq3 plain", "k=tq3 v=tq3 plain"},
           {"tq3 cs256", "k=tq3 v=tq3 sink=1 center=k,rope,256", "k=tq3 v=tq3 sink=1 center=k,rope,256"},
           {"tq4/tq3 w128 s4 ckv b2:f16 L5:tq6", "k=tq4 v=tq3 window=128 sink=4 center=kv boundary=2:f16 layers=5:tq6",
            "k=tq4 v=tq3 window=128 sink=4 center=kv boundary=2:f16 layers=5:tq6"},
           {"tq4 plain L2.1,0.0:tq4/tq2 tc", "k=tq4 v=tq4 plain trellis layers=2.1,0.0:tq4/tq2",
            "k=tq4 v=tq4 plain trellis layers=2.1,0.0:tq4/tq2"},
           {"k=tq3 sink=2 center=v", "k=tq3 v=f16 sink=2 center=v", "k=tq3 v=f16 sink=2 center=v"},
           {"tq4 k=tq3 boundary=2 boundary=q8_0", "k=tq3 v=tq4 boundary=2:q8_0", "k=tq3 v=tq4 sink=1 center=k,rope,512 boundary=2:q8_0"},
           {"tq3 center=256", "k=tq3 v=tq3 sink=1 center=k,rope,256", "k=tq3 v=tq3 sink=1 center=k,rope,256"},
           {"tq3 plain sink=2", "k=tq3 v=tq3 sink=2", "k=tq3 v=tq3 sink=2"},
           {"tq3 seed=7", "k=tq3 v=tq3 seed=7", "k=tq3 v=tq3 sink=1 center=k,rope,512 seed=7"},
       }) {
    SCOPED_TRACE(c.in);
    const tq::KvSpec s = tq::KvSpec::parse(c.in);
    EXPECT_EQ(s.to_string(), c.spec);
    EXPECT_EQ(s.resolved().to_string(), c.resolved);
  }
  EXPECT_TRUE(tq::KvSpec::parse("tq3").auto_protected());
  EXPECT_FALSE(tq::KvSpec::parse("tq3 plain").auto_protected());
  EXPECT_FALSE(tq::KvSpec::parse("f16").auto_protected());
  EXPECT_EQ(tq::KvSpec::parse("tq3 plain").protection, tq::Protection::none);
  EXPECT_EQ(tq::KvSpec::parse("tq3 s1 ck").protection, tq::Protection::given);
  EXPECT_EQ(tq::KvSpec::parse("tq3").protection, tq::Protection::automatic);
}

// Bad labels: one line, naming the bad token.
TEST(KvSpec, BadLabels) {
  struct Case {
    const char* in;
    const char* names;  // in the message
  };
  for (const Case& c : std::vector<Case>{
           {"tq3 zz", "'zz'"}, {"tq3 sink=x", "sink=x"}, {"tq3 window=-1", "window=-1"}, {"tq3 center=q", "'q'"},
           {"tq3 center=", "center="}, {"tq3 seed=1x", "seed=1x"}, {"k=tq9", "tq9"}, {"tq3 v=", "''"},
           {"tq3 boundary=2:", "boundary=2:"}, {"tq3 layers=tq4", "LAYERS:K[/V]"}, {"tq3 layers=1,:tq4", "empty layer list"},
           {"tq3 layers=x:tq4", "'x'"}, {"tq3 layers=2-1:tq4", "empty range"}, {"tq3 layers=1:fp8", "fp8"},
           {"tq3 ck:64", "removed"}, {"tq3p", "removed"}, {"tq3.5/tq3", "removed"}, {"tq3 plain center=rope", "centring"},
           {"tq3 s99999999999", "needs a number"}, {"tq3 bX:f16", "needs a number"}, {"tq3 ksx", "ksx"},
           {"", "empty"},
       }) {
    try {
      tq::KvSpec::parse(c.in);
      ADD_FAILURE() << c.in << ": no error";
    } catch (const tq::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(c.names), std::string::npos) << c.in << ": " << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  }
  // Out-of-range layers fail against the shape.
  tq::KvCacheConfig small;
  small.n_layers = 2;
  small.n_kv_heads = 1;
  EXPECT_THROW(tq::KvSpec::parse("tq3 layers=5:tq4").resolve(small), tq::Error);
  EXPECT_THROW(tq::KvSpec::parse("tq3 layers=1.1:tq4").resolve(small), tq::Error);
  EXPECT_NO_THROW(tq::KvSpec::parse("tq3 layers=1.0:tq4").resolve(small));
}
