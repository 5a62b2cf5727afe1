/* The C API of turboquant: opaque handles, status codes and a thread-local last-error
 * message. Plain C (C99 and later, and C++); no C++ type crosses it. A thin layer over the
 * C++ API of include/tq/ (src/capi/): it re-implements nothing.
 *
 * Conventions
 *  - Every function that can fail returns tq_status; TQ_OK (0) is success. On failure,
 *    tq_last_error() returns the library's message (what and where) for the calling thread,
 *    valid until that thread's next failing call; out-parameters are left untouched.
 *  - Objects are created by tq_X_create / tq_X_load into a handle (X**) and released by
 *    tq_X_free (NULL is a no-op). A handle may be used from several threads for the const
 *    calls (encode, decode, score, search, attention); mutating calls (add, append, clear)
 *    need exclusive access.
 *  - Arrays are row-major float32 / uint8 / int64, sized as each comment says; NaN or Inf in
 *    inputs is rejected (TQ_ERR_INVALID_ARGUMENT).
 *  - Names are the CLI's: quantizer kinds "mse" | "prod" | "qjl", metrics "ip" | "l2" |
 *    "cosine", KV cache labels as `tq perplexity -ctk/-ctv` / --kv-config write them
 *    ("f16", "tq4/tq3", "tq4/tq3 w128 s4 ckv", ...).
 */
#ifndef TQ_TQ_H
#define TQ_TQ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tq_status {
  TQ_OK = 0,
  TQ_ERR_INVALID_ARGUMENT = 1, /* bad argument, bad config, wrong shape, NaN/Inf, corrupt file */
  TQ_ERR_NULL_POINTER = 2,     /* a required pointer argument is NULL */
  TQ_ERR_OUT_OF_MEMORY = 3,
  TQ_ERR_INTERNAL = 4,         /* any other failure (message in tq_last_error) */
  TQ_ERR_CANCELLED = 5         /* a progress callback asked to stop; nothing was changed */
} tq_status;

/* The message of the calling thread's last failure ("" when none). Never NULL. */
const char* tq_last_error(void);
/* A static name for a status code, e.g. "TQ_ERR_INVALID_ARGUMENT". */
const char* tq_status_name(tq_status s);
/* The library version, e.g. "0.3.0". */
const char* tq_version(void);
/* The kernel set OpenBLAS picked when it was loaded (e.g. "SkylakeX", "Haswell"). Never NULL.
 * "Prescott" on a CPU with AVX2 means OpenBLAS did not know the CPU model and fell back to its
 * SSE3 kernels: k-means, IVF and prefill GEMMs run several times slower. OpenBLAS reads
 * OPENBLAS_CORETYPE only when it is loaded, so an embedding program sets it (SkylakeX on
 * AVX-512, Haswell on AVX2) in the environment it starts with; `tq` and the Python package do
 * that themselves. */
const char* tq_blas_core(void);

/* ---- codec: TurboQuant quantizers (tq/quantizer.h) ------------------------------------- */

typedef struct tq_quantizer tq_quantizer;

/* kind: "mse" | "prod" | "qjl"; dim >= 2; bits 1..8 (prod: >= 2); rotation: NULL for the
 * default randomized Hadamard, else "haar" | "hadamard" | "block32" | ... | "identity". */
tq_status tq_quantizer_create(const char* kind, int dim, int bits, const char* rotation,
                              uint64_t seed, tq_quantizer** out);
void tq_quantizer_free(tq_quantizer* q);
int tq_quantizer_dim(const tq_quantizer* q);
size_t tq_quantizer_code_bytes(const tq_quantizer* q); /* bytes per encoded vector */
/* x: n * dim floats -> codes: n * code_bytes bytes. */
tq_status tq_quantizer_encode(const tq_quantizer* q, size_t n, const float* x, uint8_t* codes);
/* codes: n * code_bytes bytes -> x: n * dim floats. */
tq_status tq_quantizer_decode(const tq_quantizer* q, size_t n, const uint8_t* codes, float* x);
/* Estimates of <query, x_i> for n coded vectors without decoding them. query: dim floats;
 * out: n floats. */
tq_status tq_quantizer_score(const tq_quantizer* q, const float* query, size_t n,
                             const uint8_t* codes, float* out);

/* ---- search: the compressed index, flat or IVF (tq/index.h) ---------------------------- */

typedef struct tq_index tq_index;

/* Build options; tq_index_options_default() fills the library's defaults. Strings are the
 * CLI's `tq index build` values. */
typedef struct tq_index_options {
  double bits;          /* 1..8, or a half-integer 1.5..7.5 (default 4) */
  const char* metric;   /* "ip" | "l2" | "cosine" (default "cosine") */
  const char* codec;    /* "mse" | "prod" (default "mse") */
  const char* scale;    /* "plain" | "corrected" | "eden" | "lsq" (default "corrected") */
  const char* norm;     /* "f16" | "f32" (default "f16") */
  const char* rotation; /* default "hadamard" */
  const char* law;      /* "beta" | "gauss" (default "beta") */
  uint64_t seed;        /* default 0x5eed */
  int keep_vectors;     /* also keep the float vectors (for rerank_full); default 0 */
  int fit_scale;        /* per-vector grid fit at build time: 1 on, 0 off, -1 (default): on for a
                           flat mse index, off otherwise (`tq index build`'s default) */
  int center;           /* subtract the first batch's mean: 1, 0, or -1 (default) as fit_scale */
  int trellis;          /* trellis-coded channels (codec mse, integer bits 1..4, flat); default 0 */
  int nlist;            /* IVF lists (k-means on the first added batch); 0: flat (default) */
  int kmeans_iters;     /* IVF: Lloyd iterations of the coarse k-means (default 10) */
  int rerank_bits;      /* IVF: bits per channel of the second-stage re-rank code, 0: none (default) */
} tq_index_options;
/* The struct grows between 0.x versions (the soname carries the minor version): fill it with
 * tq_index_options_default() and then set fields, never with a positional initializer. */

tq_index_options tq_index_options_default(void);
/* opts: NULL for the defaults. */
tq_status tq_index_create(int dim, const tq_index_options* opts, tq_index** out);
void tq_index_free(tq_index* idx);
int tq_index_dim(const tq_index* idx);
size_t tq_index_size(const tq_index* idx);
/* x: n * dim floats; ids: n int64 or NULL (tq_index_next_id(), then + 1, ...). */
tq_status tq_index_add(tq_index* idx, size_t n, const float* x, const int64_t* ids);
/* Progress of a long add: stage "k-means" / "assign" (IVF) or "encode", done rising to total
 * within it; called on the calling thread. Return 0 to go on, nonzero to cancel the add. */
typedef int (*tq_progress_fn)(const char* stage, size_t done, size_t total, void* user);
/* tq_index_add with progress (fn NULL: none). A cancel returns TQ_ERR_CANCELLED within one
 * chunk of work (256 vectors per thread) and leaves the index as it was. */
tq_status tq_index_add_progress(tq_index* idx, size_t n, const float* x, const int64_t* ids, tq_progress_fn fn,
                                void* user);
/* Removes every vector whose id is one of ids[0..n) (absent ids are skipped); *removed (may be
 * NULL) gets how many went. The rest keep their codes and order. O(size) per call: batch ids. */
tq_status tq_index_remove_ids(tq_index* idx, size_t n, const int64_t* ids, size_t* removed);
/* *out = the first id tq_index_add gives with ids NULL: one past the largest id held, 0 when
 * empty (TQ_ERR_INVALID_ARGUMENT when the index holds INT64_MAX). */
tq_status tq_index_next_id(const tq_index* idx, int64_t* out);
/* The ids held, in slot order (a flat index's insertion order; IVF: list by list), into
 * out[0..tq_index_size(idx)); cap: out's length (TQ_ERR_INVALID_ARGUMENT when smaller). */
tq_status tq_index_ids(const tq_index* idx, int64_t* out, size_t cap);
/* q: nq * dim floats; scores, ids: nq * k each (best first; missing results get id -1).
 * n_threads 0: OpenMP default. Scores: similarity for ip / cosine, squared distance for l2. */
tq_status tq_index_search(const tq_index* idx, size_t nq, const float* q, int k, int n_threads,
                          float* scores, int64_t* ids);
/* Search options (tq_search_params_default() fills the defaults; `tq index search` flags). */
typedef struct tq_search_params {
  int k;           /* results per query (default 10) */
  int n_threads;   /* 0: OpenMP default */
  int nprobe;      /* IVF: lists scanned per query, 1..nlist; a flat index: 1 (default 1) */
  int rerank;      /* scan candidates re-scored exactly (or with the second-stage code);
                      -1: k + 16 (default), 0: the scan scores */
  int rerank_full; /* candidates re-scored with the kept float vectors (keep_vectors); 0: off */
  int fast_scan;   /* 1: the uint8 SIMD scan where the codes allow it (default); 0: float tables */
  int two_level;   /* a first pass over 1 bit per dimension, full codes only for the vectors that
                      can still rank: -1 auto (default: on for fast-scan indexes of dim >= 320,
                      IVF >= 192, with 3 to 4 bits per channel), 0 off, 1 on (an error on other
                      indexes); `tq index search --two-level` (since 0.4). An index searched
                      only with 0 is faster and smaller after tq_index_release_sign_plane. */
} tq_search_params;
tq_search_params tq_search_params_default(void);
/* tq_index_search with every option; scores, ids: nq * p->k each. p NULL: the defaults. */
tq_status tq_index_search_with(const tq_index* idx, size_t nq, const float* q, const tq_search_params* p,
                               float* scores, int64_t* ids);
/* IVF lists (0 for a flat index or a NULL handle). */
int tq_index_nlist(const tq_index* idx);
/* Frees the two-level scan's sign plane (indexes of dim >= 320, IVF >= 192, at 3 to 4 bits keep one) and
 * returns the codes to the fast-scan layout: the index then searches in one level only
 * (two_level 1 is an error), with the results two_level 0 gave, in less memory (dim 784, 4 bits:
 * 106 B a vector). For an index that never searches in two levels. A no-op where there is none;
 * saves write the same file, and a loaded index holds a plane again. Not concurrent with a
 * search or an add. */
tq_status tq_index_release_sign_plane(tq_index* idx);
/* 1 when the index holds the sign plane, else 0 (also for a NULL handle). */
int tq_index_has_sign_plane(const tq_index* idx);
/* Atomic save; load validates every field and the checksum. */
tq_status tq_index_save(const tq_index* idx, const char* path);
tq_status tq_index_load(const char* path, tq_index** out);

/* ---- KV cache: quantized cache + fused attention (tq/kv_cache.h) ----------------------- */

typedef struct tq_kv_cache tq_kv_cache;

/* label: a cache label as `tq perplexity --kv-config` takes it, e.g. "f16", "tq4/tq3 plain",
 * "tq4/tq3 w128 s4 ck" (K type / V type, window, sinks, centring, ...). Shape: n_layers x
 * n_kv_heads x head_dim, at most max_tokens tokens per layer. rope_base, rope_dim: the keys'
 * RoPE (normal mode; neox: tq_kv_cache_create_rope), needed when the K mean rotates with RoPE ("cr", which a tq K type's
 * automatic protection includes unless the label says "plain" or gives a centring); 0, 0:
 * none, and such a label is an error. */
tq_status tq_kv_cache_create(const char* label, int n_layers, int n_kv_heads, int head_dim,
                             int max_tokens, float rope_base, int rope_dim, tq_kv_cache** out);
/* The same for a model whose RoPE rotates the pairs (i, i + rope_dim / 2) (rope_neox = 1:
 * GPT-NeoX style, as Qwen 2/3 and Gemma) rather than (2i, 2i + 1) (rope_neox = 0, as
 * tq_kv_cache_create): give K rows and queries as the model holds them; the cache pairs them
 * for its RoPE-aware protections itself. One base for every layer (a model with per-layer bases,
 * e.g. Gemma 3: tq_kv_cache_create_for_model). */
tq_status tq_kv_cache_create_rope(const char* label, int n_layers, int n_kv_heads, int head_dim,
                                  int max_tokens, float rope_base, int rope_dim, int rope_neox,
                                  tq_kv_cache** out);
/* The cache for one GGUF model: shape, RoPE, sliding windows and the model's properties read from
 * the file's metadata (the weights are not loaded), so "auto" and a tq K type's automatic
 * protection resolve as the tq commands resolve them on that model (e.g. scale-k on QK-norm
 * models). A file that is not a GGUF of a supported architecture is TQ_ERR_INVALID_ARGUMENT. */
tq_status tq_kv_cache_create_for_model(const char* label, const char* gguf_path, int max_tokens,
                                       tq_kv_cache** out);
/* The label of what the cache applies (the automatic parts spelled out); valid until the cache
 * is freed. NULL for a NULL handle. */
const char* tq_kv_cache_label(const tq_kv_cache* c);
void tq_kv_cache_free(tq_kv_cache* c);
/* Tokens held by one layer (-1 on a bad layer or a NULL handle, with the message set). */
int tq_kv_cache_n_tokens(const tq_kv_cache* c, int layer);
size_t tq_kv_cache_bytes_used(const tq_kv_cache* c);
/* k, v: n_tokens * n_kv_heads * head_dim floats (token-major, then head). */
tq_status tq_kv_cache_append(tq_kv_cache* c, int layer, int n_tokens, const float* k,
                             const float* v);
/* Causal attention of n_q queries (the last n_q positions of the layer) with n_heads query
 * heads (a multiple of n_kv_heads; GQA). q, out: n_q * n_heads * head_dim floats. scale 0:
 * 1/sqrt(head_dim); n_threads 0: OpenMP default. */
tq_status tq_kv_cache_attention(const tq_kv_cache* c, int layer, int n_q, int n_heads,
                                const float* q, float scale, int n_threads, float* out);
void tq_kv_cache_clear(tq_kv_cache* c);

#ifdef __cplusplus
}
#endif

#endif /* TQ_TQ_H */
