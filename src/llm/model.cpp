// The forward pass of every supported architecture (tq/model.h: llama, qwen2, qwen3, gemma3;
// their differences are the ArchTraits row and the GGUF metadata, not code paths per
// architecture), as per-layer steps (Impl::layer_qkv, Impl::attn_params, Impl::layer_out_ffn)
// that forward() strings together and a batched decode can reuse: OpenMP for the element-wise parts, tq::KvCache + tq::attention for
// attention (quantize on write). The weights stay as stored in the GGUF (Q4_1 / Q8_0 / ...
// blocks copied out of the file at load; F32 tensors as floats) and each projection (matmul
// below) takes one of two paths:
//  - a few rows (n <= kBlockKernelMaxRows = 8: decode, one token's logits): the block
//    kernels of llm/qmatvec.h, which stream ~5x fewer bytes per token than f32 weights;
//  - more rows (prefill): llm::qgemm, which unpacks panels of weight rows once per micro-batch
//    and reuses them across its rows: for the integer-activation types on AVX-512 hosts to
//    16-bit codes multiplied with x rounded to 16 bits (vpdpwssd / vpmaddwd), otherwise to a
//    per-thread f32 buffer multiplied with OpenBLAS sgemm.
// set_f32_decode(true) dequantizes every matrix to an f32 copy and sends every call to OpenBLAS
// on it (sgemv for one row): the tests hold the block kernels to it. Types without a block
// kernel (BF16) are held as f32 copies.
#include "tq/model.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "llm/activation.h"
#include "llm/qmatvec.h"
#include "tq/common.h"
#include "tq/error.h"
#include "tq/gguf.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace tq {

namespace {

// Up to this many rows per call the block kernels beat the f32 GEMM. Measured with
// bench_qmatvec Stack (every projection of one SmolLM2-135M forward, streamed from memory, 1
// thread): block kernels 9.4 / 19 / 45 ms for 1 / 4 / 8 rows vs OpenBLAS 40 / 67-69 / 77-79 ms;
// about even at 16 rows (76-94 vs 96-98 ms, noisy shared host), OpenBLAS ahead from 24.
constexpr int kBlockKernelMaxRows = 8;

// A weight matrix of `rows` rows of `cols` values. Types with a block kernel other than F32
// keep their GGUF bytes (`blocks`) and, only while f32 decode is on, an f32 copy; F32 tensors
// and types without a block kernel (BF16) keep one f32 copy (`f`; raw() points at it for F32).
struct Weight {
  std::vector<float> f;
  std::vector<uint8_t> blocks;
  GgmlType type = GgmlType::F32;
  bool kernel = false;
  size_t rows = 0, cols = 0;
  const float* data() const noexcept { return f.data(); }
  bool has_blocks() const noexcept { return kernel; }
  bool blocks_only() const noexcept { return !blocks.empty(); }  // f is a droppable copy of blocks
  const void* raw() const noexcept {
    return type == GgmlType::F32 ? static_cast<const void*>(f.data()) : static_cast<const void*>(blocks.data());
  }
  // f32 values of row r (embedding lookup).
  void row(size_t r, float* out) const {
    if (!f.empty()) std::memcpy(out, f.data() + r * cols, cols * sizeof(float));
    else dequantize_row(type, blocks.data() + r * ggml_row_bytes(type, cols), out, cols);
  }
  void set_f32_copy(bool on) {
    if (!blocks_only()) return;
    if (!on) {
      std::vector<float>().swap(f);
    } else if (f.empty()) {
      f.resize(rows * cols);
      const size_t rb = ggml_row_bytes(type, cols);
      for (size_t r = 0; r < rows; ++r) dequantize_row(type, blocks.data() + r * rb, f.data() + r * cols, cols);
    }
  }
  size_t bytes() const noexcept { return f.size() * sizeof(float) + blocks.size(); }
};

struct Layer {
  std::vector<float> attn_norm, ffn_norm;
  std::vector<float> bq, bk, bv;                  // empty: no bias
  std::vector<float> q_norm, k_norm;              // QK-norm (head_dim each), empty: none
  std::vector<float> attn_post_norm, ffn_post_norm;  // empty: none
  Weight wq, wk, wv, wo, wg, wu, wd;
};

// One forward's buffers for up to `rows` tokens.
struct Scratch {
  std::vector<float> h, q, k, v, att, tmp, g, u;
  void reserve(const LlamaConfig& c, int rows) {
    const size_t n = static_cast<size_t>(rows), E = c.n_embd, QD = c.q_dim(),
                 KV = static_cast<size_t>(c.n_kv_heads) * c.head_dim, F = c.n_ff;
    h.resize(n * E);
    tmp.resize(n * E);
    q.resize(n * QD);
    att.resize(n * QD);
    k.resize(n * KV);
    v.resize(n * KV);
    g.resize(n * F);
    u.resize(n * F);
  }
};

// The architecture table (llama.cpp: llama_model_rope_type, load_hparams, the graph builders).
const ArchTraits kArchs[] = {
    // name     neox   qk_norm post_norms gelu  embd_sqrt qkv_bias swa_pattern rope_base_swa
    {"llama",  false, false,  false,     false, false,    false,   0,          0},
    {"qwen2",  true,  false,  false,     false, false,    true,    0,          0},
    {"qwen3",  true,  true,   false,     false, false,    false,   0,          0},
    {"gemma3", true,  true,   true,      true,  true,     false,   6,          10000.0f},
};

}  // namespace

const ArchTraits* arch_traits(const std::string& arch) {
  for (const ArchTraits& t : kArchs)
    if (arch == t.name) return &t;
  return nullptr;
}

std::string supported_architectures() {
  std::string s;
  for (const ArchTraits& t : kArchs) s += (s.empty() ? "" : ", ") + std::string(t.name);
  return s;
}

struct LlamaModel::Impl {
  LlamaConfig cfg;
  Weight tok_embd, output;  // output empty when tied
  std::vector<float> output_norm;
  std::vector<Layer> layers;
  int n_threads = 0;
  AttnKernel attn = AttnKernel::fused;
  bool f32_decode = false;
  int ubatch = 512;
  const Weight& out_w() const { return cfg.tied_output ? tok_embd : output; }
  // The per-layer steps of forward() (rows: tokens at positions pos[0..n)).
  // x (n * n_embd) -> s.q (after QK-norm and RoPE), s.k (after RoPE), s.v.
  void layer_qkv(int l, const float* x, int n, const int* pos, Scratch& s) const;
  // The attention parameters of layer l for queries from position pos0 (window, scale).
  AttentionParams attn_params(int l, int pos0) const;
  // s.att (attention output, n * q_dim) -> x += post_norm(Wo att); x += post_norm(FFN(norm(x))).
  void layer_out_ffn(int l, float* x, int n, Scratch& s) const;
  // f(Weight&) for every matrix (embedding, output head, the seven of each layer).
  template <class Self, class Fn>
  static void each_matrix(Self& I, Fn&& f) {
    f(I.tok_embd);
    f(I.output);  // empty when tied
    for (auto& L : I.layers)
      for (auto* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.wg, &L.wu, &L.wd}) f(*w);
  }
};

LlamaModel::LlamaModel() : impl_(std::make_unique<Impl>()) {}
LlamaModel::LlamaModel(LlamaModel&&) noexcept = default;
LlamaModel& LlamaModel::operator=(LlamaModel&&) noexcept = default;
LlamaModel::~LlamaModel() = default;

const LlamaConfig& LlamaModel::config() const noexcept { return impl_->cfg; }

LlamaConfig LlamaModel::read_config(const GgufFile& g) {
  LlamaConfig c;
  c.arch = g.get_string("general.architecture");
  const ArchTraits* tr = arch_traits(c.arch);
  TQ_CHECK(tr != nullptr, "%s: architecture '%s' is not supported (supported: %s)", g.path().c_str(),
           c.arch.c_str(), supported_architectures().c_str());
  c.traits = *tr;
  const std::string a = c.arch + ".";
  auto geti = [&](const std::string& k, uint64_t lo, uint64_t hi) {
    const uint64_t v = g.get_uint(a + k);
    TQ_CHECK(v >= lo && v <= hi, "%s: %s%s = %llu outside [%llu, %llu]", g.path().c_str(), a.c_str(),
             k.c_str(), static_cast<unsigned long long>(v), static_cast<unsigned long long>(lo),
             static_cast<unsigned long long>(hi));
    return static_cast<int>(v);
  };
  c.n_layers = geti("block_count", 1, 1024);
  c.n_embd = geti("embedding_length", 1, 1 << 16);
  c.n_ff = geti("feed_forward_length", 1, 1 << 18);
  c.n_heads = geti("attention.head_count", 1, 1024);
  c.n_kv_heads = g.has(a + "attention.head_count_kv") ? geti("attention.head_count_kv", 1, 1024) : c.n_heads;
  TQ_CHECK(c.n_heads % c.n_kv_heads == 0, "%s: %d query heads not a multiple of %d kv heads",
           g.path().c_str(), c.n_heads, c.n_kv_heads);
  if (g.has(a + "attention.key_length")) {
    c.head_dim = geti("attention.key_length", 1, 1024);
    if (g.has(a + "attention.value_length")) {
      const int dv = geti("attention.value_length", 1, 1024);
      TQ_CHECK(dv == c.head_dim, "%s: value_length %d differs from key_length %d (not supported)",
               g.path().c_str(), dv, c.head_dim);
    }
  } else {
    TQ_CHECK(c.n_embd % c.n_heads == 0, "%s: embedding %d not divisible by %d heads", g.path().c_str(),
             c.n_embd, c.n_heads);
    c.head_dim = c.n_embd / c.n_heads;
  }
  c.rope_dim = g.has(a + "rope.dimension_count") ? geti("rope.dimension_count", 2, c.head_dim) : c.head_dim;
  TQ_CHECK(c.rope_dim % 2 == 0 && c.rope_dim <= 1024, "%s: rope dimension %d is odd or above 1024",
           g.path().c_str(), c.rope_dim);
  c.n_ctx_train = g.has(a + "context_length") ? geti("context_length", 1, 1 << 24) : 2048;
  c.rope_base = static_cast<float>(g.get_float_or(a + "rope.freq_base", 10000.0));
  c.rms_eps = static_cast<float>(g.get_float_or(a + "attention.layer_norm_rms_epsilon", 1e-5));
  TQ_CHECK(c.rope_base > 0 && c.rms_eps > 0, "%s: bad rope base or rms epsilon", g.path().c_str());
  if (c.traits.rope_base_swa > 0)
    c.traits.rope_base_swa = static_cast<float>(g.get_float_or(a + "rope.freq_base_swa", c.traits.rope_base_swa));
  // RoPE scaling as llama.cpp reads it: rope.scaling.factor (or the older rope.scale_linear)
  // scales the positions by 1 / factor; the type defaults to linear; Llama 3's scaling is the
  // rope_freqs.weight tensor (frequency factors) written by the converter.
  const double factor = g.get_float_or(a + "rope.scaling.factor", g.get_float_or(a + "rope.scale_linear", 0.0));
  const std::string scaling = g.get_string_or(a + "rope.scaling.type", "linear");
  TQ_CHECK(scaling == "linear" || scaling == "none" || factor == 0.0 || factor == 1.0,
           "%s: rope scaling '%s' is not supported (supported: linear, none and Llama 3 frequency factors)",
           g.path().c_str(), scaling.c_str());
  TQ_CHECK(factor >= 0, "%s: negative rope scaling factor", g.path().c_str());
  // type none: never scaled (llama_context does the same)
  c.rope_freq_scale = factor == 0.0 || scaling == "none" ? 1.0f : static_cast<float>(1.0 / factor);
  if (const GgufTensor* t = g.find_tensor("rope_freqs.weight")) {
    TQ_CHECK(t->ne == std::vector<uint64_t>{static_cast<uint64_t>(c.rope_dim / 2)},
             "%s: rope_freqs.weight has %zu dims (first %llu), expected one dim of rope_dim / 2 = %d",
             g.path().c_str(), t->ne.size(), t->ne.empty() ? 0ULL : static_cast<unsigned long long>(t->ne[0]),
             c.rope_dim / 2);
    c.rope_freq_factors = g.tensor_f32(*t);
    for (float f : c.rope_freq_factors)
      TQ_CHECK(std::isfinite(f) && f > 0, "%s: rope_freqs.weight holds a factor that is not finite and > 0",
               g.path().c_str());
  }
  if (c.traits.swa_pattern > 0)
    c.sliding_window = g.has(a + "attention.sliding_window") ? geti("attention.sliding_window", 0, 1 << 24) : 0;
  if (c.traits.embd_scale_sqrt) c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
  // gemma3: queries scaled by 1/sqrt(head_dim), except the 27B (62 layers): 1/sqrt(n_embd/n_heads).
  if (c.arch == "gemma3" && c.n_layers == 62) c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_heads));
  if (c.arch == "gemma3") c.final_softcap = static_cast<float>(g.get_float_or(a + "final_logit_softcapping", 0.0));
  TQ_CHECK(c.final_softcap >= 0, "%s: negative final_logit_softcapping", g.path().c_str());
  const GgufTensor* te = g.find_tensor("token_embd.weight");
  TQ_CHECK(te && te->ne.size() == 2 && te->ne[0] == static_cast<uint64_t>(c.n_embd) && te->ne[1] >= 1 &&
               te->ne[1] < (1u << 31),
           "%s: token_embd.weight is missing or has the wrong shape", g.path().c_str());
  c.n_vocab = static_cast<int>(te->ne[1]);
  if (g.has(a + "vocab_size")) {
    TQ_CHECK(g.get_uint(a + "vocab_size") == te->ne[1], "%s: vocab_size disagrees with token_embd",
             g.path().c_str());
  }
  c.tied_output = g.find_tensor("output.weight") == nullptr;
  return c;
}

LlamaModel LlamaModel::load(const GgufFile& g) {
  LlamaModel m;
  Impl& I = *m.impl_;
  openblas_set_num_threads(1);
  LlamaConfig& c = I.cfg;
  c = read_config(g);

  auto tensor = [&](const std::string& name, const std::vector<uint64_t>& ne) -> const GgufTensor& {
    const GgufTensor& t = g.tensor(name);
    TQ_CHECK(t.ne == ne, "%s: tensor '%s' has shape [%s], expected [%s]", g.path().c_str(), name.c_str(),
             [&] { std::string s; for (auto d : t.ne) s += std::to_string(d) + " "; return s; }().c_str(),
             [&] { std::string s; for (auto d : ne) s += std::to_string(d) + " "; return s; }().c_str());
    return t;
  };
  auto load = [&](const std::string& name, std::vector<uint64_t> ne) { return g.tensor_f32(tensor(name, ne)); };
  // Optional vector tensors (biases, norms): empty when absent, unless required.
  auto load_opt = [&](const std::string& name, std::vector<uint64_t> ne, bool required) {
    if (!required && g.find_tensor(name) == nullptr) return std::vector<float>();
    return load(name, ne);
  };
  // A matrix: the GGUF bytes themselves for types with a block kernel (F32 excepted), else an
  // f32 copy.
  auto load_w = [&](const std::string& name, std::vector<uint64_t> ne) {
    const GgufTensor& t = tensor(name, ne);
    Weight w;
    w.type = t.type;
    w.kernel = llm::qmatvec_supported(t.type);
    w.cols = ne[0];
    w.rows = ne[1];
    if (w.kernel && t.type != GgmlType::F32) w.blocks.assign(t.data, t.data + t.n_bytes);
    else w.f = g.tensor_f32(t);
    return w;
  };
  const ArchTraits& tr = c.traits;
  const uint64_t E = c.n_embd, F = c.n_ff, D = c.head_dim, QD = c.q_dim(),
                 KV = static_cast<uint64_t>(c.n_kv_heads) * c.head_dim, V = c.n_vocab;
  I.tok_embd = load_w("token_embd.weight", {E, V});
  I.output_norm = load("output_norm.weight", {E});
  if (!c.tied_output) I.output = load_w("output.weight", {E, V});
  I.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer& L = I.layers[l];
    L.attn_norm = load(p + "attn_norm.weight", {E});
    L.wq = load_w(p + "attn_q.weight", {E, QD});
    L.wk = load_w(p + "attn_k.weight", {E, KV});
    L.wv = load_w(p + "attn_v.weight", {E, KV});
    L.bq = load_opt(p + "attn_q.bias", {QD}, tr.qkv_bias);
    L.bk = load_opt(p + "attn_k.bias", {KV}, tr.qkv_bias);
    L.bv = load_opt(p + "attn_v.bias", {KV}, tr.qkv_bias);
    L.q_norm = load_opt(p + "attn_q_norm.weight", {D}, tr.qk_norm);
    L.k_norm = load_opt(p + "attn_k_norm.weight", {D}, tr.qk_norm);
    L.wo = load_w(p + "attn_output.weight", {QD, E});
    L.attn_post_norm = load_opt(p + "post_attention_norm.weight", {E}, tr.post_norms);
    L.ffn_norm = load(p + "ffn_norm.weight", {E});
    L.wg = load_w(p + "ffn_gate.weight", {E, F});
    L.wu = load_w(p + "ffn_up.weight", {E, F});
    L.wd = load_w(p + "ffn_down.weight", {F, E});
    L.ffn_post_norm = load_opt(p + "post_ffw_norm.weight", {E}, tr.post_norms);
  }
  return m;
}

size_t LlamaModel::weight_bytes() const noexcept {
  const Impl& I = *impl_;
  size_t n = I.output_norm.size() * sizeof(float);
  n += I.cfg.rope_freq_factors.size() * sizeof(float);
  for (auto& L : I.layers)
    n += (L.attn_norm.size() + L.ffn_norm.size() + L.bq.size() + L.bk.size() + L.bv.size() + L.q_norm.size() +
          L.k_norm.size() + L.attn_post_norm.size() + L.ffn_post_norm.size()) *
         sizeof(float);
  Impl::each_matrix(I, [&](const Weight& w) { n += w.bytes(); });
  return n;
}

size_t LlamaModel::block_weight_bytes() const noexcept {
  size_t n = 0;
  Impl::each_matrix(*impl_, [&](const Weight& w) { n += w.blocks.size(); });
  return n;
}

KvCacheConfig kv_config_for(const LlamaConfig& c, int max_tokens) {
  KvCacheConfig k;
  k.n_layers = c.n_layers;
  k.n_kv_heads = c.n_kv_heads;
  k.head_dim = c.head_dim;
  k.max_tokens = max_tokens;
  k.rope_base = c.rope_base;
  k.rope_dim = c.rope_dim;
  k.rope_neox = c.traits.rope_neox;
  k.rope_freq_factors = c.rope_freq_factors;
  for (int l = 0; l < c.n_layers; ++l) {
    k.layer_rope_base.push_back(c.layer_rope_base(l));
    k.layer_rope_scale.push_back(c.layer_rope_scale(l));
  }
  if (c.sliding_window > 0)  // the sliding-window layers drop what their window has left
    for (int l = 0; l < c.n_layers; ++l) k.layer_window.push_back(c.layer_is_swa(l) ? c.sliding_window : 0);
  return k;
}

KvCacheConfig LlamaModel::kv_config(int max_tokens) const { return kv_config_for(impl_->cfg, max_tokens); }

void LlamaModel::set_threads(int n) {
  impl_->n_threads = n > 0 ? n : omp_get_num_procs();
  openblas_set_num_threads(1);  // parallelism comes from OpenMP around it (see matmul)
}
int LlamaModel::threads() const noexcept { return impl_->n_threads > 0 ? impl_->n_threads : omp_get_max_threads(); }
void LlamaModel::set_attention_kernel(AttnKernel k) noexcept { impl_->attn = k; }
AttnKernel LlamaModel::attention_kernel() const noexcept { return impl_->attn; }
void LlamaModel::set_ubatch(int n) noexcept { impl_->ubatch = std::max(1, n); }
void LlamaModel::set_f32_decode(bool on) {
  Impl::each_matrix(*impl_, [&](Weight& w) { w.set_f32_copy(on); });
  impl_->f32_decode = on;
}
bool LlamaModel::f32_decode() const noexcept { return impl_->f32_decode; }

namespace {

// y[n, out] = x[n, in] * W^T, W: out rows of `in` values. A few rows: the block kernels on
// the GGUF bytes. More rows: llm::qgemm on the blocks (panels unpacked per thread), or
// OpenBLAS on the f32 copy when there is one (F32 / BF16 tensors, f32 decode). Both split the
// output rows over OpenMP threads and every thread calls single-threaded OpenBLAS (an
// OpenBLAS pthread pool next to spinning OpenMP workers halved the speed on 2 cores).
void matmul(const float* x, const Weight& W, float* y, int n, int in, int out, int nt, bool f32_only) {
  if (!f32_only && n <= kBlockKernelMaxRows && W.has_blocks()) {
    llm::qmatvec(W.type, W.raw(), in, out, x, n, y, out, nt);
    return;
  }
  if (W.f.empty()) {  // blocks only (the default): dequantized panel by panel
    llm::qgemm(W.type, W.blocks.data(), in, out, x, n, y, out, nt);
    return;
  }
  const float* w = W.data();
  llm::parallel_rows(out, nt, [&](int o0, int o1) {
    if (n == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, o1 - o0, in, 1.0f, w + static_cast<size_t>(o0) * in, in, x, 1,
                  0.0f, y + o0, 1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o1 - o0, in, 1.0f, x, in,
                  w + static_cast<size_t>(o0) * in, in, 0.0f, y + o0, out);
    }
  });
}

// One product of matmul_group: y[n, out] = x[n, in] * W^T.
struct Product {
  const Weight& W;
  float* y;
  int out;
};

// Several products of the same x (q, k and v; gate and up) in one OpenMP region instead of
// one per matrix when they take the block kernels (decode): each thread computes the rows of
// every matrix that llm::qmatvec's own split (llm::row_chunks / row_chunk_start)
// gives it, through qmatvec on those rows at one thread, so every value is the one separate
// calls compute. A decode step of Gemma 3 270M (18 layers) has 54 fork/joins fewer: each one
// is a barrier a descheduled thread holds up on a busy host. Otherwise separate matmul calls.
void matmul_group(const float* x, std::initializer_list<Product> ps, int n, int in, int nt, bool f32_only) {
  bool grouped = !f32_only && n <= kBlockKernelMaxRows && nt > 1;
  for (const Product& p : ps)
    grouped = grouped && p.W.has_blocks() && llm::qmatvec_supported(p.W.type) && in % ggml_block_size(p.W.type) == 0;
  if (!grouped) {
    for (const Product& p : ps) matmul(x, p.W, p.y, n, in, p.out, nt, f32_only);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int tid = omp_get_thread_num(), team = omp_get_num_threads();
    for (const Product& p : ps) {
      const int chunks = llm::row_chunks(p.out, nt);
      const size_t rb = ggml_row_bytes(p.W.type, static_cast<size_t>(in));
      for (int c = tid; c < chunks; c += team) {
        const int o0 = llm::row_chunk_start(p.out, chunks, c), o1 = llm::row_chunk_start(p.out, chunks, c + 1);
        llm::qmatvec(p.W.type, static_cast<const uint8_t*>(p.W.raw()) + o0 * rb, in, o1 - o0, x, n, p.y + o0, p.out,
                     1);
      }
    }
  }
}

// for (i = 0; i < n; ++i) f(i), over nt OpenMP threads (static schedule) when `par`, else on
// the calling thread without entering an OpenMP region: a decode step has ~230 such small
// loops (norms, RoPE, residual adds, activations of one row), and an `if (false)` region
// still costs libgomp ~0.7 us (a team of one), ~0.17 ms a Gemma 3 step.
template <class I, class F>
void for_each(I n, int nt, bool par, F&& f) {
  if (!par || nt <= 1) {
    for (I i = 0; i < n; ++i) f(i);
    return;
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (I i = 0; i < n; ++i) f(i);
}

void rmsnorm(const float* x, const float* w, float* y, int n, int d, float eps, int nt) {
  for_each(n, nt, n > 4, [&](int i) {
    const float* xi = x + static_cast<size_t>(i) * d;
    float* yi = y + static_cast<size_t>(i) * d;
    double ss = 0;
    for (int j = 0; j < d; ++j) ss += static_cast<double>(xi[j]) * xi[j];
    const float r = 1.0f / std::sqrt(static_cast<float>(ss / d) + eps);
    for (int j = 0; j < d; ++j) yi[j] = xi[j] * r * w[j];
  });
}

// In-place RoPE on n tokens * n_heads heads of head_dim, token i at position pos[i]: the first
// rope_dim dims, pair k (normal mode: dims 2k, 2k+1; neox: k, k + rope_dim/2) turned by
// pos * base^(-2k/rope_dim) / ff[k] * freq_scale (ff: frequency factors or null), the order of
// operations of ggml's rope cache.
void rope(float* x, int n, int n_heads, int head_dim, int rope_dim, const int* pos, float base, float freq_scale,
          const float* ff, bool neox, int nt) {
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(rope_dim));
  const int half = rope_dim / 2;
  for_each(n, nt, n > 4, [&](int i) {
    float cs[512], sn[512];
    float theta = static_cast<float>(pos[i]);
    for (int k = 0; k < half; ++k) {
      float ang = theta;
      if (ff) ang /= ff[k];
      if (freq_scale != 1.0f) ang *= freq_scale;
      cs[k] = std::cos(ang);
      sn[k] = std::sin(ang);
      theta *= theta_scale;
    }
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (static_cast<size_t>(i) * n_heads + h) * head_dim;
      const int stride = neox ? 1 : 2, off = neox ? half : 1;
      for (int k = 0; k < half; ++k) {
        float* p0 = v + k * stride;
        const float a = p0[0], b = p0[off];
        p0[0] = a * cs[k] - b * sn[k];
        p0[off] = a * sn[k] + b * cs[k];
      }
    }
  });
}

void add_bias(float* y, const std::vector<float>& b, int n) {
  if (b.empty()) return;
  const size_t d = b.size();
  for (int i = 0; i < n; ++i)
    for (size_t j = 0; j < d; ++j) y[i * d + j] += b[j];
}

void add_into(float* x, const float* y, size_t ne, int nt) {
  for_each(ne, nt, ne > 65536, [&](size_t j) { x[j] += y[j]; });
}

}  // namespace

void LlamaModel::Impl::layer_qkv(int l, const float* x, int n, const int* pos, Scratch& s) const {
  const LlamaConfig& c = cfg;
  const Layer& L = layers[l];
  const int nt = n_threads > 0 ? n_threads : omp_get_max_threads();
  const int E = c.n_embd, D = c.head_dim, QD = c.q_dim(), KV = c.n_kv_heads * D;
  rmsnorm(x, L.attn_norm.data(), s.h.data(), n, E, c.rms_eps, nt);
  matmul_group(s.h.data(), {{L.wq, s.q.data(), QD}, {L.wk, s.k.data(), KV}, {L.wv, s.v.data(), KV}}, n, E, nt,
               f32_decode);
  add_bias(s.q.data(), L.bq, n);
  add_bias(s.k.data(), L.bk, n);
  add_bias(s.v.data(), L.bv, n);
  if (!L.q_norm.empty()) rmsnorm(s.q.data(), L.q_norm.data(), s.q.data(), n * c.n_heads, D, c.rms_eps, nt);
  if (!L.k_norm.empty()) rmsnorm(s.k.data(), L.k_norm.data(), s.k.data(), n * c.n_kv_heads, D, c.rms_eps, nt);
  const float base = c.layer_rope_base(l), fs = c.layer_rope_scale(l);
  const float* ff = c.rope_freq_factors.empty() ? nullptr : c.rope_freq_factors.data();
  const bool neox = c.traits.rope_neox;
  rope(s.q.data(), n, c.n_heads, D, c.rope_dim, pos, base, fs, ff, neox, nt);
  rope(s.k.data(), n, c.n_kv_heads, D, c.rope_dim, pos, base, fs, ff, neox, nt);
}

AttentionParams LlamaModel::Impl::attn_params(int l, int pos0) const {
  AttentionParams ap;
  ap.n_heads = cfg.n_heads;
  ap.pos0 = pos0;
  ap.n_threads = n_threads > 0 ? n_threads : omp_get_max_threads();
  ap.kernel = attn;
  ap.scale = cfg.attn_scale;
  ap.sliding_window = cfg.layer_is_swa(l) ? cfg.sliding_window : 0;
  return ap;
}

void LlamaModel::Impl::layer_out_ffn(int l, float* x, int n, Scratch& s) const {
  const LlamaConfig& c = cfg;
  const Layer& L = layers[l];
  const int nt = n_threads > 0 ? n_threads : omp_get_max_threads();
  const int E = c.n_embd, F = c.n_ff, QD = c.q_dim();
  matmul(s.att.data(), L.wo, s.tmp.data(), n, QD, E, nt, f32_decode);
  const size_t ne = static_cast<size_t>(n) * E;
  if (!L.attn_post_norm.empty()) rmsnorm(s.tmp.data(), L.attn_post_norm.data(), s.tmp.data(), n, E, c.rms_eps, nt);
  add_into(x, s.tmp.data(), ne, nt);
  rmsnorm(x, L.ffn_norm.data(), s.h.data(), n, E, c.rms_eps, nt);
  matmul_group(s.h.data(), {{L.wg, s.g.data(), F}, {L.wu, s.u.data(), F}}, n, E, nt, f32_decode);
  const size_t nf = static_cast<size_t>(n) * F;
  float* g = s.g.data();
  const float* u = s.u.data();
  if (c.traits.gelu) {
    // GELU, tanh approximation (ggml_gelu), vectorized (llm/activation.h); rows split over
    // the threads for a prefill.
    const int parts = nf > 65536 ? nt : 1;
    for_each(parts, parts, parts > 1, [&](int p) {
      const size_t j0 = nf * p / parts, j1 = nf * (p + 1) / parts;
      llm::gelu_tanh_mul(g + j0, u + j0, j1 - j0);
    });
  } else {
    for_each(nf, nt, nf > 65536, [&](size_t j) { g[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j]; });
  }
  matmul(s.g.data(), L.wd, s.tmp.data(), n, F, E, nt, f32_decode);
  if (!L.ffn_post_norm.empty()) rmsnorm(s.tmp.data(), L.ffn_post_norm.data(), s.tmp.data(), n, E, c.rms_eps, nt);
  add_into(x, s.tmp.data(), ne, nt);
}

namespace {

void check_cache_shape(const LlamaConfig& c, const KvCache& cache) {
  const KvCacheConfig& kc = cache.config();
  TQ_CHECK(kc.n_layers == c.n_layers && kc.n_kv_heads == c.n_kv_heads && kc.head_dim == c.head_dim,
           "forward: cache shape (%d layers, %d kv heads, dim %d) does not match the model (%d, %d, %d)",
           kc.n_layers, kc.n_kv_heads, kc.head_dim, c.n_layers, c.n_kv_heads, c.head_dim);
}

// Token embeddings of tokens[0..n) into x (n * n_embd), scaled as the architecture asks.
void embed(const LlamaModel::Impl& I, const int32_t* tokens, int n, float* x) {
  const LlamaConfig& c = I.cfg;
  const int E = c.n_embd;
  for (int i = 0; i < n; ++i) {
    float* xi = x + static_cast<size_t>(i) * E;
    I.tok_embd.row(static_cast<size_t>(tokens[i]), xi);
    if (c.embd_scale != 1.0f)
      for (int j = 0; j < E; ++j) xi[j] *= c.embd_scale;
  }
}

// Rows [r0, r0 + n) of s (one sequence, first at position pos0): their K/V into `cache`, then
// their attention over it into s.att.
void cache_attention(const LlamaModel::Impl& I, KvCache& cache, int l, int r0, int n, int pos0, Scratch& s) {
  const LlamaConfig& c = I.cfg;
  const size_t QD = c.q_dim(), KV = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
  float* q = s.q.data() + r0 * QD;
  float* att = s.att.data() + r0 * QD;
  const AttentionParams ap = I.attn_params(l, pos0);
  cache.observe_queries(l, n, q, c.n_heads);
  cache.append(l, n, s.k.data() + r0 * KV, s.v.data() + r0 * KV, ap.n_threads);
  attention(cache, l, n, q, att, ap);
}

}  // namespace

void LlamaModel::forward(KvCache& cache, const int32_t* tokens, int n_total, float* hidden_out) const {
  const Impl& I = *impl_;
  const LlamaConfig& c = I.cfg;
  TQ_CHECK(n_total >= 0, "forward: negative token count");
  check_cache_shape(c, cache);
  const KvCacheConfig& kc = cache.config();
  for (int i = 0; i < n_total; ++i)
    TQ_CHECK(tokens[i] >= 0 && tokens[i] < c.n_vocab, "forward: token id %d outside the vocabulary", tokens[i]);
  const int nt = threads();
  const int E = c.n_embd;
  const int ub = std::min(I.ubatch, std::max(1, n_total));
  std::vector<float> x(static_cast<size_t>(ub) * E);
  std::vector<int> pos(ub);
  Scratch s;
  s.reserve(c, ub);

  for (int b0 = 0; b0 < n_total; b0 += ub) {
    const int n = std::min(ub, n_total - b0);
    const int pos0 = cache.n_tokens(0);
    TQ_CHECK(pos0 + n <= kc.max_tokens, "forward: %d + %d tokens exceed the cache capacity %d", pos0, n,
             kc.max_tokens);
    for (int i = 0; i < n; ++i) pos[i] = pos0 + i;
    embed(I, tokens + b0, n, x.data());
    for (int l = 0; l < c.n_layers; ++l) {
      I.layer_qkv(l, x.data(), n, pos.data(), s);
      cache_attention(I, cache, l, 0, n, pos0, s);
      I.layer_out_ffn(l, x.data(), n, s);
    }
    if (hidden_out)
      rmsnorm(x.data(), I.output_norm.data(), hidden_out + static_cast<size_t>(b0) * E, n, E, c.rms_eps, nt);
  }
}

// One decode step of n_seqs sequences, token i appended to caches[i]: the same per-layer steps as
// forward() over n_seqs rows, so each weight is read once for all sequences; only the cache
// append and attention run per sequence.
void LlamaModel::forward_batch(KvCache* const* caches, const int32_t* tokens, int n_seqs, float* hidden_out) const {
  const Impl& I = *impl_;
  const LlamaConfig& c = I.cfg;
  TQ_CHECK(n_seqs >= 0, "forward_batch: negative sequence count");
  if (n_seqs == 0) return;
  for (int i = 0; i < n_seqs; ++i) {
    TQ_CHECK(caches[i] != nullptr, "forward_batch: null cache %d", i);
    check_cache_shape(c, *caches[i]);
    for (int j = 0; j < i; ++j) TQ_CHECK(caches[j] != caches[i], "forward_batch: cache %d given twice", i);
    TQ_CHECK(tokens[i] >= 0 && tokens[i] < c.n_vocab, "forward_batch: token id %d outside the vocabulary", tokens[i]);
    TQ_CHECK(caches[i]->n_tokens(0) < caches[i]->config().max_tokens, "forward_batch: cache %d is full (%d tokens)",
             i, caches[i]->config().max_tokens);
  }
  const int E = c.n_embd, nt = threads();
  std::vector<float> x(static_cast<size_t>(n_seqs) * E);
  std::vector<int> pos(n_seqs);
  for (int i = 0; i < n_seqs; ++i) pos[i] = caches[i]->n_tokens(0);
  embed(I, tokens, n_seqs, x.data());
  Scratch s;
  s.reserve(c, n_seqs);
  for (int l = 0; l < c.n_layers; ++l) {
    I.layer_qkv(l, x.data(), n_seqs, pos.data(), s);
    for (int i = 0; i < n_seqs; ++i) cache_attention(I, *caches[i], l, i, 1, pos[i], s);
    I.layer_out_ffn(l, x.data(), n_seqs, s);
  }
  if (hidden_out) rmsnorm(x.data(), I.output_norm.data(), hidden_out, n_seqs, E, c.rms_eps, nt);
}

void LlamaModel::logits(const float* hidden, int n, float* out) const {
  const Impl& I = *impl_;
  matmul(hidden, I.out_w(), out, n, I.cfg.n_embd, I.cfg.n_vocab, threads(), I.f32_decode);
  if (I.cfg.final_softcap > 0) {
    const float cap = I.cfg.final_softcap;
    const size_t ne = static_cast<size_t>(n) * I.cfg.n_vocab;
    for (size_t j = 0; j < ne; ++j) out[j] = cap * std::tanh(out[j] / cap);
  }
}

std::vector<float> LlamaModel::forward_last(KvCache& cache, const std::vector<int32_t>& tokens) const {
  TQ_CHECK(!tokens.empty(), "forward_last: no tokens");
  const int E = impl_->cfg.n_embd;
  std::vector<float> hidden(tokens.size() * static_cast<size_t>(E));
  forward(cache, tokens.data(), static_cast<int>(tokens.size()), hidden.data());
  std::vector<float> out(impl_->cfg.n_vocab);
  logits(hidden.data() + (tokens.size() - 1) * E, 1, out.data());
  return out;
}

}  // namespace tq
