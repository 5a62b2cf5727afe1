// The C API (include/tq/tq.h): opaque handles over the C++ objects, every call wrapped so
// that no exception crosses into C; a failure sets the thread-local last-error message.
#include "tq/simd.h"
#include "tq/tq.h"

#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "capi/kv_config.h"
#include "tq/error.h"
#include "tq/index.h"
#include "tq/gguf.h"
#include "tq/kv_cache.h"
#include "tq/kv_spec.h"
#include "tq/model.h"
#include "tq/quantizer.h"

#ifndef TQ_VERSION_STRING
#define TQ_VERSION_STRING "unknown"
#endif

struct tq_quantizer {
  std::unique_ptr<tq::Quantizer> q;
};
struct tq_index {
  tq::Index idx;
};
struct tq_kv_cache {
  tq::KvCache cache;
  std::string label;  // what the cache applies (KvSpec::to_string of the resolved spec)
  tq_kv_cache(const tq::KvCacheConfig& c, std::string l) : cache(c), label(std::move(l)) {}
};

namespace {

thread_local std::string g_last_error;

tq_status fail(tq_status s, const char* msg) {
  try {
    g_last_error = msg;
  } catch (...) {
  }
  return s;
}

// Runs f, turning exceptions into status codes and the thread's last-error message.
template <class F>
tq_status guard(F&& f) noexcept {
  try {
    f();
    return TQ_OK;
  } catch (const tq::Error& e) {
    return fail(TQ_ERR_INVALID_ARGUMENT, e.what());
  } catch (const std::bad_alloc&) {
    return fail(TQ_ERR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return fail(TQ_ERR_INTERNAL, e.what());
  } catch (...) {
    return fail(TQ_ERR_INTERNAL, "unknown error");
  }
}

#define TQ_CAPI_NONNULL(p, fn)                                                   \
  do {                                                                           \
    if (!(p)) return fail(TQ_ERR_NULL_POINTER, fn ": " #p " is NULL");           \
  } while (0)

std::string str_or(const char* s, const char* dflt) { return s ? std::string(s) : std::string(dflt); }

}  // namespace

extern "C" {

const char* tq_last_error(void) { return g_last_error.c_str(); }

const char* tq_status_name(tq_status s) {
  switch (s) {
    case TQ_OK: return "TQ_OK";
    case TQ_ERR_INVALID_ARGUMENT: return "TQ_ERR_INVALID_ARGUMENT";
    case TQ_ERR_NULL_POINTER: return "TQ_ERR_NULL_POINTER";
    case TQ_ERR_OUT_OF_MEMORY: return "TQ_ERR_OUT_OF_MEMORY";
    case TQ_ERR_INTERNAL: return "TQ_ERR_INTERNAL";
    case TQ_ERR_CANCELLED: return "TQ_ERR_CANCELLED";
  }
  return "TQ_ERR_UNKNOWN_STATUS";
}

const char* tq_version(void) { return TQ_VERSION_STRING; }
const char* tq_blas_core(void) { return tq::simd::blas_core(); }

// ---- codec

tq_status tq_quantizer_create(const char* kind, int dim, int bits, const char* rotation, uint64_t seed,
                              tq_quantizer** out) {
  TQ_CAPI_NONNULL(kind, "tq_quantizer_create");
  TQ_CAPI_NONNULL(out, "tq_quantizer_create");
  return guard([&] {
    tq::QuantizerConfig c;
    c.dim = dim;
    c.bits = bits;
    if (rotation) c.rotation = tq::parse_rotation(rotation);
    c.seed = seed;
    auto h = std::make_unique<tq_quantizer>();
    h->q = tq::make_quantizer(tq::parse_quantizer_kind(kind), c);
    *out = h.release();
  });
}

void tq_quantizer_free(tq_quantizer* q) { delete q; }
int tq_quantizer_dim(const tq_quantizer* q) { return q ? q->q->dim() : 0; }
size_t tq_quantizer_code_bytes(const tq_quantizer* q) { return q ? q->q->code_bytes() : 0; }

tq_status tq_quantizer_encode(const tq_quantizer* q, size_t n, const float* x, uint8_t* codes) {
  TQ_CAPI_NONNULL(q, "tq_quantizer_encode");
  if (n == 0) return TQ_OK;
  TQ_CAPI_NONNULL(x, "tq_quantizer_encode");
  TQ_CAPI_NONNULL(codes, "tq_quantizer_encode");
  return guard([&] { q->q->encode(n, x, codes); });
}

tq_status tq_quantizer_decode(const tq_quantizer* q, size_t n, const uint8_t* codes, float* x) {
  TQ_CAPI_NONNULL(q, "tq_quantizer_decode");
  if (n == 0) return TQ_OK;
  TQ_CAPI_NONNULL(codes, "tq_quantizer_decode");
  TQ_CAPI_NONNULL(x, "tq_quantizer_decode");
  return guard([&] { q->q->decode(n, codes, x); });
}

tq_status tq_quantizer_score(const tq_quantizer* q, const float* query, size_t n, const uint8_t* codes,
                             float* out) {
  TQ_CAPI_NONNULL(q, "tq_quantizer_score");
  TQ_CAPI_NONNULL(query, "tq_quantizer_score");
  if (n == 0) return TQ_OK;
  TQ_CAPI_NONNULL(codes, "tq_quantizer_score");
  TQ_CAPI_NONNULL(out, "tq_quantizer_score");
  return guard([&] {
    const size_t d = static_cast<size_t>(q->q->dim());
    for (size_t i = 0; i < d; ++i)
      TQ_CHECK(std::isfinite(query[i]), "quantizer score: query[%zu] is not finite", i);
    std::unique_ptr<float[]> st(new float[q->q->query_state_floats()]);
    q->q->prepare_query(query, st.get());
    q->q->score(st.get(), n, codes, out);
  });
}

// ---- index

tq_index_options tq_index_options_default(void) {
  tq_index_options o;
  o.bits = 4;
  o.metric = "cosine";
  o.codec = "mse";
  o.scale = "corrected";
  o.norm = "f16";
  o.rotation = "hadamard";
  o.law = "beta";
  o.seed = 0x5eed;
  o.keep_vectors = 0;
  o.fit_scale = -1;
  o.center = -1;
  o.trellis = 0;
  o.nlist = 0;
  o.kmeans_iters = 10;
  o.rerank_bits = 0;
  return o;
}

tq_status tq_index_create(int dim, const tq_index_options* opts, tq_index** out) {
  TQ_CAPI_NONNULL(out, "tq_index_create");
  const tq_index_options o = opts ? *opts : tq_index_options_default();
  return guard([&] {
    tq::IndexConfig c;
    c.dim = dim;
    c.bits = o.bits;
    c.metric = tq::parse_metric(str_or(o.metric, "cosine"));
    c.codec = tq::parse_quantizer_kind(str_or(o.codec, "mse"));
    TQ_CHECK(c.codec != tq::QuantizerKind::qjl, "index: codec must be mse or prod");
    c.scale = tq::parse_scale_mode(str_or(o.scale, "corrected"));
    c.norm = tq::parse_norm_format(str_or(o.norm, "f16"));
    c.rotation = tq::parse_rotation(str_or(o.rotation, "hadamard"));
    c.law = tq::parse_law(str_or(o.law, "beta"));
    c.seed = o.seed;
    c.keep_vectors = o.keep_vectors != 0;
    c.trellis = o.trellis != 0;
    c.nlist = o.nlist;
    TQ_CHECK(o.fit_scale >= -1 && o.fit_scale <= 1, "index: fit_scale must be -1, 0 or 1, got %d", o.fit_scale);
    TQ_CHECK(o.center >= -1 && o.center <= 1, "index: center must be -1, 0 or 1, got %d", o.center);
    // -1: the CLI's default, on for a flat mse index.
    const bool flat_mse = c.codec == tq::QuantizerKind::mse && c.nlist == 0;
    c.fit_scale = o.fit_scale < 0 ? flat_mse : o.fit_scale != 0;
    c.center = o.center < 0 ? flat_mse : o.center != 0;
    c.kmeans_iters = o.kmeans_iters;
    c.rerank_bits = o.rerank_bits;
    *out = new tq_index{tq::Index(c)};
  });
}

void tq_index_free(tq_index* idx) { delete idx; }
int tq_index_dim(const tq_index* idx) { return idx ? idx->idx.dim() : 0; }
size_t tq_index_size(const tq_index* idx) { return idx ? idx->idx.size() : 0; }

tq_status tq_index_add(tq_index* idx, size_t n, const float* x, const int64_t* ids) {
  TQ_CAPI_NONNULL(idx, "tq_index_add");
  if (n == 0) return TQ_OK;
  TQ_CAPI_NONNULL(x, "tq_index_add");
  return guard([&] { idx->idx.add(n, x, ids); });
}

tq_status tq_index_add_progress(tq_index* idx, size_t n, const float* x, const int64_t* ids, tq_progress_fn fn,
                                void* user) {
  TQ_CAPI_NONNULL(idx, "tq_index_add_progress");
  if (n == 0) return TQ_OK;
  TQ_CAPI_NONNULL(x, "tq_index_add_progress");
  if (!fn) return tq_index_add(idx, n, x, ids);
  // A nonzero return becomes an exception, which the library takes as a cancel: it undoes the
  // add and rethrows it here.
  struct Cancelled {};
  bool cancelled = false;
  const tq_status st = guard([&] {
    try {
      idx->idx.add(n, x, ids, [fn, user](const char* stage, size_t done, size_t total) {
        if (fn(stage, done, total, user) != 0) throw Cancelled{};
      });
    } catch (const Cancelled&) {
      cancelled = true;
    }
  });
  if (cancelled)
    return fail(TQ_ERR_CANCELLED, "tq_index_add_progress: cancelled by the progress callback; the index is unchanged");
  return st;
}

tq_status tq_index_remove_ids(tq_index* idx, size_t n, const int64_t* ids, size_t* removed) {
  TQ_CAPI_NONNULL(idx, "tq_index_remove_ids");
  if (removed) *removed = 0;
  if (n == 0) return TQ_OK;
  TQ_CAPI_NONNULL(ids, "tq_index_remove_ids");
  return guard([&] {
    const size_t r = idx->idx.remove_ids(n, ids);
    if (removed) *removed = r;
  });
}

tq_status tq_index_next_id(const tq_index* idx, int64_t* out) {
  TQ_CAPI_NONNULL(idx, "tq_index_next_id");
  TQ_CAPI_NONNULL(out, "tq_index_next_id");
  return guard([&] { *out = idx->idx.next_id(); });
}

tq_status tq_index_ids(const tq_index* idx, int64_t* out, size_t cap) {
  TQ_CAPI_NONNULL(idx, "tq_index_ids");
  const size_t n = idx->idx.size();
  if (n == 0) return TQ_OK;
  TQ_CAPI_NONNULL(out, "tq_index_ids");
  return guard([&] {
    TQ_CHECK(cap >= n, "tq_index_ids: out holds %zu ids, the index %zu", cap, n);
    const std::vector<int64_t> ids = idx->idx.ids();
    std::copy(ids.begin(), ids.end(), out);
  });
}

tq_search_params tq_search_params_default(void) {
  const tq::SearchParams d;
  tq_search_params p;
  p.k = d.k;
  p.n_threads = d.n_threads;
  p.nprobe = d.nprobe;
  p.rerank = d.rerank;
  p.rerank_full = d.rerank_full;
  p.fast_scan = d.fast_scan ? 1 : 0;
  p.two_level = d.two_level;
  return p;
}

tq_status tq_index_search_with(const tq_index* idx, size_t nq, const float* q, const tq_search_params* params,
                               float* scores, int64_t* ids) {
  TQ_CAPI_NONNULL(idx, "tq_index_search_with");
  const tq_search_params o = params ? *params : tq_search_params_default();
  return guard([&] {
    tq::SearchParams p;
    p.k = o.k;
    p.n_threads = o.n_threads;
    p.nprobe = o.nprobe;
    p.rerank = o.rerank;
    p.rerank_full = o.rerank_full;
    p.fast_scan = o.fast_scan != 0;
    p.two_level = o.two_level;
    idx->idx.search(nq, q, p, scores, ids);
  });
}

tq_status tq_index_search(const tq_index* idx, size_t nq, const float* q, int k, int n_threads,
                          float* scores, int64_t* ids) {
  TQ_CAPI_NONNULL(idx, "tq_index_search");
  tq_search_params p = tq_search_params_default();
  p.k = k;
  p.n_threads = n_threads;
  return tq_index_search_with(idx, nq, q, &p, scores, ids);
}

int tq_index_nlist(const tq_index* idx) { return idx ? idx->idx.nlist() : 0; }

tq_status tq_index_release_sign_plane(tq_index* idx) {
  TQ_CAPI_NONNULL(idx, "tq_index_release_sign_plane");
  return guard([&] { idx->idx.release_sign_plane(); });
}

int tq_index_has_sign_plane(const tq_index* idx) { return idx && idx->idx.has_sign_plane() ? 1 : 0; }

tq_status tq_index_save(const tq_index* idx, const char* path) {
  TQ_CAPI_NONNULL(idx, "tq_index_save");
  TQ_CAPI_NONNULL(path, "tq_index_save");
  return guard([&] { idx->idx.save(path); });
}

tq_status tq_index_load(const char* path, tq_index** out) {
  TQ_CAPI_NONNULL(path, "tq_index_load");
  TQ_CAPI_NONNULL(out, "tq_index_load");
  return guard([&] { *out = new tq_index{tq::Index::load(path)}; });
}

// ---- KV cache

namespace {
// Both creators, after each has checked its pointers under its own name.
tq_status kv_cache_create(const char* label, int n_layers, int n_kv_heads, int head_dim, int max_tokens,
                          float rope_base, int rope_dim, int rope_neox, tq_kv_cache** out) {
  return guard([&] {
    TQ_CHECK(rope_neox == 0 || rope_neox == 1, "kv cache: rope_neox must be 0 or 1, got %d", rope_neox);
    const tq::KvSpec kv = tq::capi::kv_options(label);  // parsed (an @file read) once
    *out = new tq_kv_cache(tq::capi::kv_cache_config(kv, label, n_layers, n_kv_heads, head_dim, max_tokens,
                                                     rope_base, rope_dim, rope_neox != 0),
                           kv.resolved().to_string());
  });
}
}  // namespace

tq_status tq_kv_cache_create_rope(const char* label, int n_layers, int n_kv_heads, int head_dim, int max_tokens,
                                  float rope_base, int rope_dim, int rope_neox, tq_kv_cache** out) {
  TQ_CAPI_NONNULL(label, "tq_kv_cache_create_rope");
  TQ_CAPI_NONNULL(out, "tq_kv_cache_create_rope");
  return kv_cache_create(label, n_layers, n_kv_heads, head_dim, max_tokens, rope_base, rope_dim, rope_neox, out);
}

tq_status tq_kv_cache_create(const char* label, int n_layers, int n_kv_heads, int head_dim, int max_tokens,
                             float rope_base, int rope_dim, tq_kv_cache** out) {
  TQ_CAPI_NONNULL(label, "tq_kv_cache_create");
  TQ_CAPI_NONNULL(out, "tq_kv_cache_create");
  return kv_cache_create(label, n_layers, n_kv_heads, head_dim, max_tokens, rope_base, rope_dim, 0, out);
}

tq_status tq_kv_cache_create_for_model(const char* label, const char* gguf_path, int max_tokens, tq_kv_cache** out) {
  TQ_CAPI_NONNULL(label, "tq_kv_cache_create_for_model");
  TQ_CAPI_NONNULL(gguf_path, "tq_kv_cache_create_for_model");
  TQ_CAPI_NONNULL(out, "tq_kv_cache_create_for_model");
  return guard([&] {
    TQ_CHECK(max_tokens >= 1, "kv cache: max_tokens (%d) must be >= 1", max_tokens);
    const tq::LlamaConfig model = tq::LlamaModel::read_config(tq::GgufFile::open(gguf_path));
    const tq::KvSpec kv = tq::capi::kv_options(label);
    *out = new tq_kv_cache(kv.resolve(model, max_tokens), kv.resolved(model).to_string());
  });
}

const char* tq_kv_cache_label(const tq_kv_cache* c) { return c ? c->label.c_str() : nullptr; }

void tq_kv_cache_free(tq_kv_cache* c) { delete c; }

int tq_kv_cache_n_tokens(const tq_kv_cache* c, int layer) {
  if (!c) return fail(TQ_ERR_NULL_POINTER, "tq_kv_cache_n_tokens: c is NULL"), -1;
  int n = -1;
  if (guard([&] { n = c->cache.n_tokens(layer); }) != TQ_OK) return -1;
  return n;
}

size_t tq_kv_cache_bytes_used(const tq_kv_cache* c) { return c ? c->cache.bytes_used() : 0; }

tq_status tq_kv_cache_append(tq_kv_cache* c, int layer, int n_tokens, const float* k, const float* v) {
  TQ_CAPI_NONNULL(c, "tq_kv_cache_append");
  return guard([&] { c->cache.append(layer, n_tokens, k, v); });
}

tq_status tq_kv_cache_attention(const tq_kv_cache* c, int layer, int n_q, int n_heads, const float* q,
                                float scale, int n_threads, float* out) {
  TQ_CAPI_NONNULL(c, "tq_kv_cache_attention");
  return guard([&] {
    tq::AttentionParams p;
    p.n_heads = n_heads;
    p.scale = scale;
    p.n_threads = n_threads;
    tq::attention(c->cache, layer, n_q, q, out, p);
  });
}

void tq_kv_cache_clear(tq_kv_cache* c) {
  if (c) c->cache.clear();
}

}  // extern "C"
