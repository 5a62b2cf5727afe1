// Fuzz target: what the model commands build from a GGUF file after the reader accepted it:
// the byte-level BPE tokenizer (tokenizer.ggml.* metadata: vocabulary, merges, token types,
// special ids) and the llama model loader (hyper-parameters and tensor shapes).
//
// Input: the GGUF bytes. Anything malformed must be a tq::Error. When the tokenizer builds,
// a fixed text (ASCII, UTF-8, control bytes, special-token spellings) is encoded and every
// id must be < n_vocab and decode without error; when the model loads (small models only:
// the loader's config is checked against a size budget first), one token is run through it.
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tq/common.h"
#include "tq/error.h"
#include "tq/gguf.h"
#include "tq/kv_cache.h"
#include "tq/model.h"
#include "tq/tokenizer.h"

namespace {

// GPT-2 byte-level BPE: the printable character that stands for byte b.
std::string byte_token(int b) {
  auto direct = [](int x) { return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255); };
  int cp = b;
  if (!direct(b)) {
    int n = 0;
    for (int x = 0; x < b; ++x) n += !direct(x);
    cp = 256 + n;
  }
  std::string u;
  if (cp < 0x80) {
    u.push_back(static_cast<char>(cp));
  } else {
    u.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    u.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return u;
}

void add_tokenizer(tq::GgufWriter& w, bool with_merges) {
  std::vector<std::string> toks = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  std::vector<int32_t> types = {3, 3, 3};
  for (int b = 0; b < 256; ++b) {
    toks.push_back(byte_token(b));
    types.push_back(1);
  }
  std::vector<std::string> merges;
  if (with_merges) {
    const std::string G = byte_token(' ');
    merges = {"h e", "l l", "he ll", "hell o", G + " w", "o r"};
    for (auto& m : merges) {
      toks.push_back(m.substr(0, m.find(' ')) + m.substr(m.find(' ') + 1));
      types.push_back(1);
    }
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "smollm");
  w.set_str_array("tokenizer.ggml.tokens", toks);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_str_array("tokenizer.ggml.merges", merges);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
}

const char kText[] =
    "hello world, hello\tWORLD 12345 <|im_start|>user\nhi<|im_end|> \xc3\xa9t\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 "
    "\x01\x7f \xff\xfe broken";

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = tq_fuzz::seed_dir();
  if (dir.empty()) return 0;
  // Seeds: tokenizer-only files and a tiny llama (2 layers, d = 32) with a tokenizer.
  for (bool merges : {false, true}) {
    tq::GgufWriter w(3);
    add_tokenizer(w, merges);
    tq_fuzz::write_seed(dir, merges ? "tokenizer_merges" : "tokenizer_bytes", w.bytes());
  }
  tq::GgufWriter w(3);
  const uint64_t E = 32, F = 48, H = 2, KVH = 1, V = 3 + 256 + 6, HD = E / H;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 1);
  w.set_u32("llama.embedding_length", E);
  w.set_u32("llama.feed_forward_length", F);
  w.set_u32("llama.attention.head_count", H);
  w.set_u32("llama.attention.head_count_kv", KVH);
  w.set_u32("llama.rope.dimension_count", HD);
  w.set_f32("llama.rope.freq_base", 10000.0f);
  w.set_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.set_u32("llama.context_length", 64);
  add_tokenizer(w, true);
  tq::Rng r(1);
  auto add = [&](const std::string& name, std::vector<uint64_t> ne, tq::GgmlType t) {
    size_t n = 1;
    for (auto d : ne) n *= d;
    std::vector<float> x(n);
    for (auto& v : x) v = static_cast<float>(r.normal() * 0.1);
    w.add_tensor(name, ne, t, x.data());
  };
  add("token_embd.weight", {E, V}, tq::GgmlType::Q8_0);
  add("output_norm.weight", {E}, tq::GgmlType::F32);
  add("blk.0.attn_norm.weight", {E}, tq::GgmlType::F32);
  add("blk.0.attn_q.weight", {E, E}, tq::GgmlType::F16);
  add("blk.0.attn_k.weight", {E, KVH * HD}, tq::GgmlType::F16);
  add("blk.0.attn_v.weight", {E, KVH * HD}, tq::GgmlType::F16);
  add("blk.0.attn_output.weight", {E, E}, tq::GgmlType::Q4_0);
  add("blk.0.ffn_norm.weight", {E}, tq::GgmlType::F32);
  add("blk.0.ffn_gate.weight", {E, F}, tq::GgmlType::Q4_1);
  add("blk.0.ffn_up.weight", {E, F}, tq::GgmlType::BF16);
  add("blk.0.ffn_down.weight", {F, E}, tq::GgmlType::F32);
  tq_fuzz::write_seed(dir, "tiny_llama_tokenizer", w.bytes());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    tq::GgufFile g = tq::GgufFile::from_bytes(data, size);
    try {
      tq::Tokenizer tok(g);
      const int nv = tok.n_vocab();
      TQ_FUZZ_REQUIRE(nv > 0);
      for (bool special : {false, true}) {
        const std::vector<int32_t> ids = tok.encode(kText, special);
        for (int32_t id : ids) TQ_FUZZ_REQUIRE(id >= 0 && id < nv);
        (void)tok.decode(ids, special);
      }
    } catch (const tq::Error&) {
    }
    // The model loader dequantizes every weight: only try files whose tensors are small.
    size_t total = 0;
    for (const auto& t : g.tensors()) total += t.n_elements;
    if (total <= (size_t(1) << 20)) {
      tq::LlamaModel m = tq::LlamaModel::load(g);
      m.set_threads(1);
      tq::KvCacheConfig kc = m.kv_config(4);
      kc.type_k = kc.type_v = tq::KvFormat::f32;
      tq::KvCache cache(kc);
      const int32_t t0 = 0;
      std::vector<float> hidden(static_cast<size_t>(m.config().n_embd));
      m.forward(cache, &t0, 1, hidden.data());
    }
  } catch (const tq::Error&) {
  }
  return 0;
}
