// Fuzz target: the name parsers behind the CLI's type options (tq::parse_rotation,
// tq::parse_law, tq::parse_quantizer_kind, tq::simd::set_level, tq::parse_kv_type,
// tq::parse_metric, tq::parse_scale_mode).
//
// Input: byte 0 picks the parser, the rest is the name (any bytes, embedded NULs included).
// Properties: a parser either returns a value whose canonical name parses back to the same
// value, or throws tq::Error whose message is one line and lists the valid names; any other
// exception escapes and is reported by libFuzzer as a crash.
#include <string>

#include "fuzz_util.h"
#include "tq/codebook.h"
#include "tq/error.h"
#include "tq/index.h"
#include "tq/kv_cache.h"
#include "tq/quantizer.h"
#include "tq/rotation.h"
#include "tq/simd.h"

namespace {

bool one_line(const tq::Error& e) { return std::string(e.what()).find('\n') == std::string::npos; }

// An error for a bad name must say so and list the valid names (`valid` is one of them).
// The message quotes the user's input, so only require one line when the input has none.
void check_error(const tq::Error& e, const std::string& input, const char* valid) {
  const std::string m = e.what();
  TQ_FUZZ_REQUIRE(m.find(valid) != std::string::npos);
  if (input.find('\n') == std::string::npos) TQ_FUZZ_REQUIRE(one_line(e));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = tq_fuzz::seed_dir();
  if (dir.empty()) return 0;
  // Seeds: every valid name (from the library's own name functions) for every parser.
  auto seed = [&](uint8_t which, const std::string& name) {
    std::string b(1, static_cast<char>(which));
    b += name;
    tq_fuzz::write_seed(dir, "p" + std::to_string(which) + "_" + name, b.data(), b.size());
  };
  for (const char* r : {"haar", "hadamard", "block32", "block64", "block128", "givens", "iso4", "identity"})
    seed(0, tq::rotation_name(tq::parse_rotation(r)));
  seed(1, tq::law_name(tq::Law::beta));
  seed(1, tq::law_name(tq::Law::gauss));
  for (auto k : {tq::QuantizerKind::mse, tq::QuantizerKind::prod, tq::QuantizerKind::qjl})
    seed(2, tq::quantizer_kind_name(k));
  for (const auto& l : tq::simd::available_levels()) seed(3, l);
  seed(3, "auto");
  for (const auto& k : tq::kv_type_names()) seed(4, k);
  for (auto m : {tq::Metric::ip, tq::Metric::l2, tq::Metric::cosine}) seed(5, tq::metric_name(m));
  for (auto m : {tq::ScaleMode::plain, tq::ScaleMode::corrected, tq::ScaleMode::eden, tq::ScaleMode::lsq})
    seed(6, tq::scale_mode_name(m));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string s(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 7) {
    case 0:
      try {
        const tq::RotationSpec r = tq::parse_rotation(s);
        const tq::RotationSpec back = tq::parse_rotation(tq::rotation_name(r));
        TQ_FUZZ_REQUIRE(back.kind == r.kind && back.block == r.block);
        TQ_FUZZ_REQUIRE(s == tq::rotation_name(r) || s == "none");
      } catch (const tq::Error& e) {
        check_error(e, s, "hadamard");
      }
      break;
    case 1:
      try {
        const tq::Law l = tq::parse_law(s);
        TQ_FUZZ_REQUIRE(tq::parse_law(tq::law_name(l)) == l);
        TQ_FUZZ_REQUIRE(s == tq::law_name(l) || s == "gaussian");
      } catch (const tq::Error& e) {
        check_error(e, s, "gauss");
      }
      break;
    case 2:
      try {
        const tq::QuantizerKind k = tq::parse_quantizer_kind(s);
        TQ_FUZZ_REQUIRE(tq::parse_quantizer_kind(tq::quantizer_kind_name(k)) == k);
        TQ_FUZZ_REQUIRE(s == tq::quantizer_kind_name(k));
      } catch (const tq::Error& e) {
        check_error(e, s, "prod");
      }
      break;
    case 3:
      try {
        tq::simd::ScopedLevel level(s);
        const std::string cur = tq::simd::current_level();
        bool known = cur == "scalar";
        for (const auto& l : tq::simd::available_levels()) known = known || l == cur;
        TQ_FUZZ_REQUIRE(known);
      } catch (const tq::Error& e) {
        check_error(e, s, "scalar");
      }
      break;
    case 4:
      try {
        const tq::KvType t = tq::parse_kv_type(s);
        TQ_FUZZ_REQUIRE(tq::kv_type_name(t) == s);
        TQ_FUZZ_REQUIRE(tq::parse_kv_type(tq::kv_type_name(t)) == t);
        (void)tq::kv_type_bytes(t, 128);
      } catch (const tq::Error& e) {
        check_error(e, s, "f16");
      }
      break;
    case 5:
      try {
        const tq::Metric m = tq::parse_metric(s);
        TQ_FUZZ_REQUIRE(s == tq::metric_name(m));
      } catch (const tq::Error& e) {
        check_error(e, s, "cosine");
      }
      break;
    case 6:
      try {
        const tq::ScaleMode m = tq::parse_scale_mode(s);
        TQ_FUZZ_REQUIRE(s == tq::scale_mode_name(m));
      } catch (const tq::Error& e) {
        check_error(e, s, "corrected");
      }
      break;
  }
  return 0;
}
