// Fuzz target: the GGUF reader (include/tq/gguf.h, src/llm/gguf.cpp).
//
// Input: the bytes of a would-be GGUF file, parsed with GgufFile::from_bytes. A malformed
// file must be a tq::Error (any other exception or a crash is a finding). When it parses:
//   - every tensor's data range lies inside the buffer (its first and last byte are read
//     under ASan) and n_bytes matches its type and shape;
//   - every metadata value can be read back through the typed getters (wrong types are a
//     tq::Error, never a crash);
//   - tensors are dequantized in full (tensor_f32, up to 4M values per input).
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tq/common.h"
#include "tq/error.h"
#include "tq/gguf.h"

namespace {

std::vector<float> ramp(size_t n, uint64_t seed) {
  tq::Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.normal());
  return v;
}

void exercise(const tq::GgufFile& g, size_t size) {
  for (const auto& [key, v] : g.metadata()) {
    TQ_FUZZ_REQUIRE(g.has(key));
    (void)v.arr_size();
    try { (void)g.get_string(key); } catch (const tq::Error&) {}
    try { (void)g.get_uint(key); } catch (const tq::Error&) {}
    try { (void)g.get_float(key); } catch (const tq::Error&) {}
    try { (void)g.get_bool(key); } catch (const tq::Error&) {}
    try { (void)g.get_str_array(key).size(); } catch (const tq::Error&) {}
    try { (void)g.get_int_array(key).size(); } catch (const tq::Error&) {}
  }
  size_t budget = size_t(1) << 22;  // values dequantized per input
  for (const auto& t : g.tensors()) {
    TQ_FUZZ_REQUIRE(g.find_tensor(t.name) == &t);
    TQ_FUZZ_REQUIRE(!t.ne.empty() && t.ne.size() <= 4);
    size_t n = 1;
    for (auto d : t.ne) n *= static_cast<size_t>(d);
    TQ_FUZZ_REQUIRE(n == t.n_elements);
    TQ_FUZZ_REQUIRE(t.n_bytes == tq::ggml_row_bytes(t.type, t.n_elements));
    TQ_FUZZ_REQUIRE(t.n_bytes <= size && t.offset <= size - t.n_bytes);
    // All tensors share one data section: data - offset is the same address for each.
    const tq::GgufTensor& t0 = g.tensors()[0];
    TQ_FUZZ_REQUIRE(t.data - t.offset == t0.data - t0.offset);
    // Touch the first and last byte of every tensor (ASan checks they are in the copy).
    volatile uint8_t edge = static_cast<uint8_t>(t.data[0] ^ t.data[t.n_bytes - 1]);
    (void)edge;
    if (t.n_elements <= budget) {
      budget -= t.n_elements;
      const std::vector<float> f = g.tensor_f32(t);
      TQ_FUZZ_REQUIRE(f.size() == t.n_elements);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = tq_fuzz::seed_dir();
  if (dir.empty()) return 0;
  // Seeds written by tq::GgufWriter: every metadata type, every tensor type, v2 and v3,
  // a non-default alignment, and a tiny llama-like file.
  for (uint32_t version : {2u, 3u}) {
    tq::GgufWriter w(version);
    w.set_string("general.architecture", "llama");
    w.set_u32("llama.block_count", 2);
    w.set_i32("some.i32", -7);
    w.set_u64("some.u64", 1ull << 40);
    w.set_f32("some.f32", 1.5f);
    w.set_f64("some.f64", -2.25);
    w.set_bool("some.bool", true);
    w.set_str_array("tokenizer.ggml.tokens", {"<s>", "</s>", "a", "b", " "});
    w.set_i32_array("some.ints", {1, -2, 3});
    w.set_f32_array("some.floats", {0.5f, -1.0f});
    tq_fuzz::write_seed(dir, "meta_v" + std::to_string(version), w.bytes());
  }
  const tq::GgmlType types[] = {tq::GgmlType::F32, tq::GgmlType::F16, tq::GgmlType::BF16,
                                tq::GgmlType::Q4_0, tq::GgmlType::Q4_1, tq::GgmlType::Q8_0};
  for (auto ty : types) {
    tq::GgufWriter w(3);
    w.set_string("general.architecture", "llama");
    const auto a = ramp(64, 1), b = ramp(32 * 3, 2);
    w.add_tensor("a", {32, 2}, ty, a.data());
    w.add_tensor("b", {32, 3, 1}, ty, b.data());
    tq_fuzz::write_seed(dir, std::string("tensors_") + tq::ggml_type_name(ty), w.bytes());
  }
  {
    tq::GgufWriter w(3);
    w.set_alignment(64);
    const auto a = ramp(32, 3);
    w.add_tensor("x", {32}, tq::GgmlType::F32, a.data());
    w.add_tensor("y", {32}, tq::GgmlType::Q8_0, a.data());
    tq_fuzz::write_seed(dir, "align64", w.bytes());
  }
  {
    tq::GgufWriter w(3);
    w.set_string("general.architecture", "llama");
    w.set_u32("llama.embedding_length", 32);
    w.set_u32("llama.block_count", 1);
    w.set_u32("llama.attention.head_count", 2);
    w.set_u32("llama.attention.head_count_kv", 1);
    w.set_u32("llama.feed_forward_length", 64);
    w.set_u32("llama.context_length", 128);
    w.set_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    w.set_f32("llama.rope.freq_base", 10000.0f);
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_str_array("tokenizer.ggml.tokens", {"a", "b", "ab", "\xc4\xa0"});
    w.set_str_array("tokenizer.ggml.merges", {"a b"});
    w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 1});
    const auto e = ramp(4 * 32, 4);
    w.add_tensor("token_embd.weight", {32, 4}, tq::GgmlType::F16, e.data());
    w.add_tensor("output_norm.weight", {32}, tq::GgmlType::F32, e.data());
    tq_fuzz::write_seed(dir, "tiny_llama", w.bytes());
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    // from_bytes parses an exact-size heap copy, so ASan flags any read past its end.
    tq::GgufFile g = tq::GgufFile::from_bytes(data, size);
    exercise(g, size);
  } catch (const tq::Error&) {
  }
  return 0;
}
