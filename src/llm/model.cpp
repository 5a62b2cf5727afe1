// Llama forward pass: OpenMP for the element-wise parts, tq::KvCache + tq::attention for
// attention (quantize on write). The weights stay as stored in the GGUF (Q4_1 / Q8_0 / ...
// blocks copied out of the file at load; F32 tensors as floats) and each projection (matmul
// below) takes one of two paths:
//  - a few rows (n <= kBlockKernelMaxRows = 8: decode, one token's logits): the block
//    kernels of llm/qmatvec.h, which stream ~5x fewer bytes per token than f32 weights;
//  - more rows (prefill): llm::qgemm, which dequantizes panels of weight rows into a per-thread
//    f32 buffer and multiplies them with OpenBLAS sgemm (the GEMM reuses each panel across
//    the rows, so the dequantization is paid once per micro-batch, not per row).
// TQ_F32_DECODE=1 (or set_f32_decode(true), `--f32-decode`) dequantizes every matrix to an f32
// copy and sends every call to OpenBLAS on it (sgemv for one row), for A/B runs. Types without
// a block kernel (BF16) are held as f32 copies.
#include "tq/model.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

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
  Weight wq, wk, wv, wo, wg, wu, wd;
};

}  // namespace

struct LlamaModel::Impl {
  LlamaConfig cfg;
  Weight tok_embd, output;  // output empty when tied
  std::vector<float> output_norm;
  std::vector<Layer> layers;
  int n_threads = 0;
  AttentionImpl attn = AttentionImpl::Fused;
  bool exact = false;
  bool lut8 = false;
  bool f32_decode = env_flag("TQ_F32_DECODE");
  int ubatch = 512;
  const Weight& out_w() const { return cfg.tied_output ? tok_embd : output; }
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

LlamaModel LlamaModel::load(const GgufFile& g) {
  LlamaModel m;
  Impl& I = *m.impl_;
  openblas_set_num_threads(1);
  LlamaConfig& c = I.cfg;
  c.arch = g.get_string("general.architecture");
  TQ_CHECK(c.arch == "llama", "%s: architecture '%s' is not supported (only 'llama')", g.path().c_str(),
           c.arch.c_str());
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
  TQ_CHECK(c.n_embd % c.n_heads == 0, "%s: embedding %d not divisible by %d heads", g.path().c_str(),
           c.n_embd, c.n_heads);
  TQ_CHECK(c.n_heads % c.n_kv_heads == 0, "%s: %d query heads not a multiple of %d kv heads",
           g.path().c_str(), c.n_heads, c.n_kv_heads);
  c.head_dim = c.n_embd / c.n_heads;
  c.rope_dim = g.has(a + "rope.dimension_count") ? geti("rope.dimension_count", 2, c.head_dim) : c.head_dim;
  TQ_CHECK(c.rope_dim % 2 == 0, "%s: odd rope dimension %d", g.path().c_str(), c.rope_dim);
  c.n_ctx_train = g.has(a + "context_length") ? geti("context_length", 1, 1 << 24) : 2048;
  c.rope_base = static_cast<float>(g.get_float_or(a + "rope.freq_base", 10000.0));
  c.rms_eps = static_cast<float>(g.get_float_or(a + "attention.layer_norm_rms_epsilon", 1e-5));
  TQ_CHECK(c.rope_base > 0 && c.rms_eps > 0, "%s: bad rope base or rms epsilon", g.path().c_str());

  auto tensor = [&](const std::string& name, const std::vector<uint64_t>& ne) -> const GgufTensor& {
    const GgufTensor& t = g.tensor(name);
    TQ_CHECK(t.ne == ne, "%s: tensor '%s' has shape [%s], expected [%s]", g.path().c_str(), name.c_str(),
             [&] { std::string s; for (auto d : t.ne) s += std::to_string(d) + " "; return s; }().c_str(),
             [&] { std::string s; for (auto d : ne) s += std::to_string(d) + " "; return s; }().c_str());
    return t;
  };
  auto load = [&](const std::string& name, std::vector<uint64_t> ne) { return g.tensor_f32(tensor(name, ne)); };
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
  const uint64_t E = c.n_embd, F = c.n_ff, KV = static_cast<uint64_t>(c.n_kv_heads) * c.head_dim;
  const GgufTensor& te = g.tensor("token_embd.weight");
  TQ_CHECK(te.ne.size() == 2 && te.ne[0] == E, "%s: token_embd.weight has the wrong shape", g.path().c_str());
  c.n_vocab = static_cast<int>(te.ne[1]);
  if (g.has(a + "vocab_size")) {
    TQ_CHECK(g.get_uint(a + "vocab_size") == te.ne[1], "%s: vocab_size disagrees with token_embd",
             g.path().c_str());
  }
  I.tok_embd = load_w("token_embd.weight", {E, te.ne[1]});
  I.output_norm = load("output_norm.weight", {E});
  c.tied_output = g.find_tensor("output.weight") == nullptr;
  if (!c.tied_output) I.output = load_w("output.weight", {E, te.ne[1]});
  I.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer& L = I.layers[l];
    L.attn_norm = load(p + "attn_norm.weight", {E});
    L.wq = load_w(p + "attn_q.weight", {E, E});
    L.wk = load_w(p + "attn_k.weight", {E, KV});
    L.wv = load_w(p + "attn_v.weight", {E, KV});
    L.wo = load_w(p + "attn_output.weight", {E, E});
    L.ffn_norm = load(p + "ffn_norm.weight", {E});
    L.wg = load_w(p + "ffn_gate.weight", {E, F});
    L.wu = load_w(p + "ffn_up.weight", {E, F});
    L.wd = load_w(p + "ffn_down.weight", {F, E});
  }
  if (I.f32_decode) m.set_f32_decode(true);  // TQ_F32_DECODE
  return m;
}

size_t LlamaModel::weight_bytes() const noexcept {
  const Impl& I = *impl_;
  size_t n = I.output_norm.size() * sizeof(float);
  for (auto& L : I.layers) n += (L.attn_norm.size() + L.ffn_norm.size()) * sizeof(float);
  Impl::each_matrix(I, [&](const Weight& w) { n += w.bytes(); });
  return n;
}

size_t LlamaModel::block_weight_bytes() const noexcept {
  size_t n = 0;
  Impl::each_matrix(*impl_, [&](const Weight& w) { n += w.blocks.size(); });
  return n;
}

KvCacheConfig LlamaModel::kv_config(int max_tokens) const {
  KvCacheConfig k;
  k.n_layers = impl_->cfg.n_layers;
  k.n_kv_heads = impl_->cfg.n_kv_heads;
  k.head_dim = impl_->cfg.head_dim;
  k.max_tokens = max_tokens;
  k.rope_base = impl_->cfg.rope_base;
  k.rope_dim = impl_->cfg.rope_dim;
  return k;
}

void LlamaModel::set_threads(int n) {
  impl_->n_threads = n > 0 ? n : omp_get_num_procs();
  openblas_set_num_threads(1);  // parallelism comes from OpenMP around it (see matmul)
}
int LlamaModel::threads() const noexcept { return impl_->n_threads > 0 ? impl_->n_threads : omp_get_max_threads(); }
void LlamaModel::set_attention_impl(AttentionImpl a) noexcept { impl_->attn = a; }
void LlamaModel::set_attention_exact(bool e) noexcept { impl_->exact = e; }
void LlamaModel::set_attention_lut8(bool e) noexcept { impl_->lut8 = e; }
void LlamaModel::set_ubatch(int n) noexcept { impl_->ubatch = std::max(1, n); }
void LlamaModel::set_f32_decode(bool on) {
  Impl::each_matrix(*impl_, [&](Weight& w) { w.set_f32_copy(on); });
  impl_->f32_decode = on;
}
bool LlamaModel::f32_decode() const noexcept { return impl_->f32_decode; }

namespace {

// y[n, out] = x[n, in] * W^T, W: out rows of `in` values. A few rows: the block kernels on
// the GGUF bytes. More rows: llm::qgemm on the blocks (panels dequantized per thread), or
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

void rmsnorm(const float* x, const float* w, float* y, int n, int d, float eps, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static) if (n > 4)
  for (int i = 0; i < n; ++i) {
    const float* xi = x + static_cast<size_t>(i) * d;
    float* yi = y + static_cast<size_t>(i) * d;
    double ss = 0;
    for (int j = 0; j < d; ++j) ss += static_cast<double>(xi[j]) * xi[j];
    const float r = 1.0f / std::sqrt(static_cast<float>(ss / d) + eps);
    for (int j = 0; j < d; ++j) yi[j] = xi[j] * r * w[j];
  }
}

// In-place RoPE, normal (adjacent-pair) mode, on n tokens * n_heads heads of head_dim; token i
// at position pos[i].
void rope(float* x, int n, int n_heads, int head_dim, int rope_dim, const int* pos, float base, int nt) {
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(rope_dim));
#pragma omp parallel for num_threads(nt) schedule(static) if (n > 4)
  for (int i = 0; i < n; ++i) {
    float cs[512], sn[512];
    float theta = static_cast<float>(pos[i]);
    for (int k = 0; k < rope_dim / 2; ++k) {
      cs[k] = std::cos(theta);
      sn[k] = std::sin(theta);
      theta *= theta_scale;
    }
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (static_cast<size_t>(i) * n_heads + h) * head_dim;
      for (int k = 0; k < rope_dim / 2; ++k) {
        const float a = v[2 * k], b = v[2 * k + 1];
        v[2 * k] = a * cs[k] - b * sn[k];
        v[2 * k + 1] = a * sn[k] + b * cs[k];
      }
    }
  }
}

}  // namespace

// Scratch of one forward step over up to `rows` token rows.
namespace {

struct Step {
  std::vector<float> x, h, q, att, tmp, k, v, g, u;
  std::vector<int> pos;
  Step(const LlamaConfig& c, int rows) {
    const size_t E = c.n_embd, KV = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
    for (auto* b : {&x, &h, &q, &att, &tmp}) b->resize(rows * E);
    k.resize(rows * KV);
    v.resize(rows * KV);
    g.resize(rows * static_cast<size_t>(c.n_ff));
    u.resize(g.size());
    pos.resize(rows);
  }
};

// The layers over n token rows in s.x (at positions s.pos), then the final norm into
// hidden_out. `cache_attn(l)` is the only per-sequence part: it hands the roped q / k / v rows
// of layer l (s.q, s.k, s.v) to each sequence's cache and attention (into s.att). forward() runs
// one sequence; forward_batch() one row per sequence, so each weight is read once for all.
template <class CacheAttn>
void layers_step(const LlamaModel::Impl& I, int nt, Step& s, int n, float* hidden_out, CacheAttn&& cache_attn) {
  const LlamaConfig& c = I.cfg;
  const int E = c.n_embd, F = c.n_ff, D = c.head_dim, KV = c.n_kv_heads * D;
  float *x = s.x.data(), *h = s.h.data(), *q = s.q.data(), *k = s.k.data(), *v = s.v.data(), *tmp = s.tmp.data();
  float *g = s.g.data(), *u = s.u.data();
  for (int l = 0; l < c.n_layers; ++l) {
    const Layer& L = I.layers[l];
    rmsnorm(x, L.attn_norm.data(), h, n, E, c.rms_eps, nt);
    matmul(h, L.wq, q, n, E, E, nt, I.f32_decode);
    matmul(h, L.wk, k, n, E, KV, nt, I.f32_decode);
    matmul(h, L.wv, v, n, E, KV, nt, I.f32_decode);
    rope(q, n, c.n_heads, D, c.rope_dim, s.pos.data(), c.rope_base, nt);
    rope(k, n, c.n_kv_heads, D, c.rope_dim, s.pos.data(), c.rope_base, nt);
    cache_attn(l);
    matmul(s.att.data(), L.wo, tmp, n, E, E, nt, I.f32_decode);
    const size_t ne = static_cast<size_t>(n) * E;
#pragma omp parallel for num_threads(nt) schedule(static) if (ne > 65536)
    for (size_t j = 0; j < ne; ++j) x[j] += tmp[j];
    rmsnorm(x, L.ffn_norm.data(), h, n, E, c.rms_eps, nt);
    matmul(h, L.wg, g, n, E, F, nt, I.f32_decode);
    matmul(h, L.wu, u, n, E, F, nt, I.f32_decode);
    const size_t nf = static_cast<size_t>(n) * F;
#pragma omp parallel for num_threads(nt) schedule(static) if (nf > 65536)
    for (size_t j = 0; j < nf; ++j) g[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
    matmul(g, L.wd, tmp, n, F, E, nt, I.f32_decode);
#pragma omp parallel for num_threads(nt) schedule(static) if (ne > 65536)
    for (size_t j = 0; j < ne; ++j) x[j] += tmp[j];
  }
  if (hidden_out) rmsnorm(x, I.output_norm.data(), hidden_out, n, E, c.rms_eps, nt);
}

// K/V of rows [r0, r0 + n) (one sequence, first at position pos0) into `cache`, then their
// attention over it.
void cache_attention(const LlamaModel::Impl& I, int nt, Step& s, KvCache& cache, int l, int r0, int n, int pos0) {
  const LlamaConfig& c = I.cfg;
  const size_t E = c.n_embd, KV = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
  float* q = s.q.data() + r0 * E;
  cache.observe_queries(l, n, q, c.n_heads);
  cache.append(l, n, s.k.data() + r0 * KV, s.v.data() + r0 * KV, nt);
  AttentionParams ap;
  ap.n_heads = c.n_heads;
  ap.pos0 = pos0;
  ap.n_threads = nt;
  ap.exact = I.exact;
  ap.lut8 = I.lut8;
  float* att = s.att.data() + r0 * E;
  if (I.attn == AttentionImpl::Fused) attention(cache, l, n, q, att, ap);
  else attention_ref(cache, l, n, q, att, ap);
}

void check_cache(const LlamaConfig& c, const KvCache& cache) {
  const KvCacheConfig& kc = cache.config();
  TQ_CHECK(kc.n_layers == c.n_layers && kc.n_kv_heads == c.n_kv_heads && kc.head_dim == c.head_dim,
           "forward: cache shape (%d layers, %d kv heads, dim %d) does not match the model (%d, %d, %d)",
           kc.n_layers, kc.n_kv_heads, kc.head_dim, c.n_layers, c.n_kv_heads, c.head_dim);
}

}  // namespace

void LlamaModel::forward(KvCache& cache, const int32_t* tokens, int n_total, float* hidden_out) const {
  const Impl& I = *impl_;
  const LlamaConfig& c = I.cfg;
  TQ_CHECK(n_total >= 0, "forward: negative token count");
  check_cache(c, cache);
  const KvCacheConfig& kc = cache.config();
  for (int i = 0; i < n_total; ++i)
    TQ_CHECK(tokens[i] >= 0 && tokens[i] < c.n_vocab, "forward: token id %d outside the vocabulary", tokens[i]);
  const int E = c.n_embd, nt = threads();
  const int ub = std::min(I.ubatch, std::max(1, n_total));
  Step s(c, ub);
  for (int b0 = 0; b0 < n_total; b0 += ub) {
    const int n = std::min(ub, n_total - b0);
    const int pos0 = cache.n_tokens(0);
    TQ_CHECK(pos0 + n <= kc.max_tokens, "forward: %d + %d tokens exceed the cache capacity %d", pos0, n,
             kc.max_tokens);
    for (int i = 0; i < n; ++i) {
      I.tok_embd.row(static_cast<size_t>(tokens[b0 + i]), &s.x[static_cast<size_t>(i) * E]);
      s.pos[i] = pos0 + i;
    }
    layers_step(I, nt, s, n, hidden_out ? hidden_out + static_cast<size_t>(b0) * E : nullptr,
                [&](int l) { cache_attention(I, nt, s, cache, l, 0, n, pos0); });
  }
}

void LlamaModel::forward_batch(KvCache* const* caches, const int32_t* tokens, int n_seqs, float* hidden_out) const {
  const Impl& I = *impl_;
  const LlamaConfig& c = I.cfg;
  TQ_CHECK(n_seqs >= 0, "forward_batch: negative sequence count");
  if (n_seqs == 0) return;
  for (int i = 0; i < n_seqs; ++i) {
    TQ_CHECK(caches[i] != nullptr, "forward_batch: null cache %d", i);
    check_cache(c, *caches[i]);
    for (int j = 0; j < i; ++j) TQ_CHECK(caches[j] != caches[i], "forward_batch: cache %d given twice", i);
    TQ_CHECK(tokens[i] >= 0 && tokens[i] < c.n_vocab, "forward_batch: token id %d outside the vocabulary", tokens[i]);
    TQ_CHECK(caches[i]->n_tokens(0) < caches[i]->config().max_tokens,
             "forward_batch: cache %d is full (%d tokens)", i, caches[i]->config().max_tokens);
  }
  const int E = c.n_embd;
  Step s(c, n_seqs);
  for (int i = 0; i < n_seqs; ++i) {
    I.tok_embd.row(static_cast<size_t>(tokens[i]), &s.x[static_cast<size_t>(i) * E]);
    s.pos[i] = caches[i]->n_tokens(0);
  }
  const int nt = threads();
  layers_step(I, nt, s, n_seqs, hidden_out, [&](int l) {
    for (int i = 0; i < n_seqs; ++i) cache_attention(I, nt, s, *caches[i], l, i, 1, s.pos[i]);
  });
}

void LlamaModel::logits(const float* hidden, int n, float* out) const {
  const Impl& I = *impl_;
  matmul(hidden, I.out_w(), out, n, I.cfg.n_embd, I.cfg.n_vocab, threads(), I.f32_decode);
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
