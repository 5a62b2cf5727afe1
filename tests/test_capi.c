/* The C API (include/tq/tq.h) from C99: every entry point, its error paths (status code +
 * thread-local message, never a crash) and results checked against plain C references. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tq/tq.h"

static int g_failed = 0, g_passed = 0;
static const char* g_index_path = "test_capi.tqi"; /* argv[1] when given */
static const char* g_models_dir = NULL;             /* argv[2]: the fetched GGUF models */
#define CHECK(cond)                                                      \
  do {                                                                   \
    if (cond) {                                                          \
      ++g_passed;                                                        \
    } else {                                                             \
      ++g_failed;                                                        \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              tq_last_error());                                          \
    }                                                                    \
  } while (0)

/* Deterministic pseudo-random floats in [-1, 1). */
static uint64_t g_rng = 88172645463325252ull;
static float frand(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (float)((g_rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void test_errors(void) {
  tq_quantizer* q = NULL;
  CHECK(strcmp(tq_version(), "") != 0);
  CHECK(tq_blas_core() != NULL && strlen(tq_blas_core()) > 0);
  if (getenv("OPENBLAS_CORETYPE") && *getenv("OPENBLAS_CORETYPE")) /* OpenBLAS takes a set kernel set */
    CHECK(strcasecmp(tq_blas_core(), getenv("OPENBLAS_CORETYPE")) == 0);
  CHECK(tq_quantizer_create("nope", 64, 4, NULL, 1, &q) == TQ_ERR_INVALID_ARGUMENT);
  CHECK(q == NULL);
  CHECK(strstr(tq_last_error(), "nope") != NULL); /* the library's message names the bad kind */
  CHECK(tq_quantizer_create("mse", 1, 4, NULL, 1, &q) == TQ_ERR_INVALID_ARGUMENT);
  CHECK(tq_quantizer_create("mse", 64, 9, NULL, 1, &q) == TQ_ERR_INVALID_ARGUMENT);
  CHECK(tq_quantizer_create("mse", 64, 4, "bogus-rotation", 1, &q) == TQ_ERR_INVALID_ARGUMENT);
  CHECK(tq_quantizer_create(NULL, 64, 4, NULL, 1, &q) == TQ_ERR_NULL_POINTER);
  CHECK(tq_quantizer_create("mse", 64, 4, NULL, 1, NULL) == TQ_ERR_NULL_POINTER);
  CHECK(strlen(tq_last_error()) > 0);
  CHECK(tq_index_load("/nonexistent/dir/x.tqi", NULL) == TQ_ERR_NULL_POINTER);
  {
    tq_index* idx = NULL;
    CHECK(tq_index_load("/nonexistent/dir/x.tqi", &idx) == TQ_ERR_INVALID_ARGUMENT);
    CHECK(idx == NULL);
    CHECK(strstr(tq_last_error(), "/nonexistent/dir/x.tqi") != NULL);
  }
  CHECK(strcmp(tq_status_name(TQ_ERR_OUT_OF_MEMORY), "TQ_ERR_OUT_OF_MEMORY") == 0);
  tq_quantizer_free(NULL);
  tq_index_free(NULL);
  tq_kv_cache_free(NULL);
}

static void test_codec(void) {
  enum { D = 64, N = 50 };
  static float x[N * D], y[N * D], s[N];
  tq_quantizer* q = NULL;
  CHECK(tq_quantizer_create("mse", D, 4, NULL, 7, &q) == TQ_OK);
  if (!q) return;
  CHECK(tq_quantizer_dim(q) == D);
  const size_t cb = tq_quantizer_code_bytes(q);
  CHECK(cb == 2 + D * 4 / 8); /* f16 norm + 4-bit indices */
  uint8_t* codes = (uint8_t*)malloc(N * cb);
  for (int i = 0; i < N * D; ++i) x[i] = frand();
  CHECK(tq_quantizer_encode(q, N, x, codes) == TQ_OK);
  CHECK(tq_quantizer_decode(q, N, codes, y) == TQ_OK);
  /* 4-bit TurboQuant_mse: relative squared error about 0.009 per vector; allow 0.03. */
  double err = 0, norm = 0;
  for (int i = 0; i < N * D; ++i) {
    err += (double)(x[i] - y[i]) * (x[i] - y[i]);
    norm += (double)x[i] * x[i];
  }
  CHECK(err / norm < 0.03);
  /* score on the codes = <query, decoded vector> (mse codes: exact up to float rounding). */
  CHECK(tq_quantizer_score(q, x, N, codes, s) == TQ_OK);
  int score_ok = 1;
  for (int i = 0; i < N; ++i) {
    double dot = 0;
    for (int j = 0; j < D; ++j) dot += (double)x[j] * y[i * D + j];
    if (fabs(dot - s[i]) > 1e-3 * (1 + fabs(dot))) score_ok = 0;
  }
  CHECK(score_ok);
  /* NaN input: an error, nothing written past it matters. */
  x[5] = NAN;
  CHECK(tq_quantizer_encode(q, N, x, codes) == TQ_ERR_INVALID_ARGUMENT);
  CHECK(strlen(tq_last_error()) > 0);
  CHECK(tq_quantizer_score(q, x, N, codes, s) == TQ_ERR_INVALID_ARGUMENT);
  CHECK(tq_quantizer_encode(q, N, NULL, codes) == TQ_ERR_NULL_POINTER);
  free(codes);
  tq_quantizer_free(q);
}

/* Progress callback of test_index: counts calls and "encode" calls, cancels at the encode
 * call number cancel_at (0: never). */
typedef struct {
  int calls, encodes, cancel_at;
  size_t last_done, last_total;
} progress_log;
static int on_progress(const char* stage, size_t done, size_t total, void* user) {
  progress_log* p = (progress_log*)user;
  ++p->calls;
  p->last_done = done;
  p->last_total = total;
  if (strcmp(stage, "encode") == 0 && ++p->encodes == p->cancel_at) return 1;
  return 0;
}

static void test_index(void) {
  enum { D = 32, N = 300, NQ = 5, K = 4 };
  static float x[N * D], qv[NQ * D], s1[NQ * K], s2[NQ * K];
  static int64_t i1[NQ * K], i2[NQ * K], ids[N];
  for (int i = 0; i < N * D; ++i) x[i] = frand();
  for (int i = 0; i < N; ++i) ids[i] = 1000 + i;
  /* queries: noisy copies of base vectors 3, 30, ..., so their own id should come first */
  for (int i = 0; i < NQ; ++i)
    for (int j = 0; j < D; ++j) qv[i * D + j] = x[(30 * i + 3) * D + j] + 0.01f * frand();
  tq_index_options o = tq_index_options_default();
  o.metric = "l2";
  tq_index* idx = NULL;
  CHECK(tq_index_create(D, &o, &idx) == TQ_OK);
  if (!idx) return;
  CHECK(tq_index_dim(idx) == D);
  CHECK(tq_index_add(idx, N, x, ids) == TQ_OK);
  CHECK(tq_index_size(idx) == N);
  CHECK(tq_index_search(idx, NQ, qv, K, 1, s1, i1) == TQ_OK);
  for (int i = 0; i < NQ; ++i) {
    CHECK(i1[i * K] == 1000 + 30 * i + 3);
    CHECK(s1[i * K] <= s1[i * K + 1]); /* l2: ascending distances */
  }
  CHECK(tq_index_search(idx, NQ, qv, 0, 1, s1, i1) == TQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tq_last_error(), "k") != NULL);
  const char* path = g_index_path;
  CHECK(tq_index_save(idx, path) == TQ_OK);
  tq_index* idx2 = NULL;
  CHECK(tq_index_load(path, &idx2) == TQ_OK);
  remove(path);
  if (idx2) {
    CHECK(tq_index_size(idx2) == N);
    CHECK(tq_index_search(idx2, NQ, qv, K, 1, s2, i2) == TQ_OK);
    CHECK(memcmp(i1, i2, sizeof i1) == 0);
    CHECK(memcmp(s1, s2, sizeof s1) == 0);
    tq_index_free(idx2);
  }
  /* remove: the queries' own vectors go, absent ids are skipped; the same search then returns
   * what it returned below them */
  {
    int64_t gone[NQ + 1];
    for (int i = 0; i < NQ; ++i) gone[i] = 1000 + 30 * i + 3;
    gone[NQ] = 99; /* not held */
    size_t removed = 12345;
    CHECK(tq_index_remove_ids(idx, NQ + 1, gone, &removed) == TQ_OK);
    CHECK(removed == NQ);
    CHECK(tq_index_size(idx) == N - NQ);
    CHECK(tq_index_search(idx, NQ, qv, K - 1, 1, s2, i2) == TQ_OK);
    for (int i = 0; i < NQ; ++i)
      for (int j = 0; j < K - 1; ++j) {
        CHECK(i2[i * (K - 1) + j] == i1[i * K + j + 1]);
        CHECK(s2[i * (K - 1) + j] == s1[i * K + j + 1]);
      }
    /* the ids left, in insertion order */
    int64_t held[N];
    CHECK(tq_index_ids(idx, held, N) == TQ_OK);
    int h = 0, same = 1;
    for (int i = 0; i < N; ++i)
      if (!(i % 30 == 3 && i / 30 < NQ)) same &= h < N - NQ && held[h++] == 1000 + i;
    CHECK(same && h == N - NQ);
    CHECK(tq_index_ids(idx, held, N - NQ - 1) == TQ_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tq_last_error(), "tq_index_ids") != NULL);
    CHECK(tq_index_ids(idx, NULL, N) == TQ_ERR_NULL_POINTER);
    CHECK(tq_index_ids(NULL, held, N) == TQ_ERR_NULL_POINTER);
    CHECK(tq_index_remove_ids(idx, 1, NULL, &removed) == TQ_ERR_NULL_POINTER);
    CHECK(strstr(tq_last_error(), "tq_index_remove_ids") != NULL);
    CHECK(tq_index_remove_ids(NULL, 1, gone, NULL) == TQ_ERR_NULL_POINTER);
    CHECK(tq_index_remove_ids(idx, 0, NULL, &removed) == TQ_OK && removed == 0);
    /* default ids continue after the largest held (1299), not from the size */
    int64_t next = 0;
    CHECK(tq_index_next_id(idx, &next) == TQ_OK && next == 1000 + N);
    CHECK(tq_index_next_id(NULL, &next) == TQ_ERR_NULL_POINTER);
    CHECK(tq_index_next_id(idx, NULL) == TQ_ERR_NULL_POINTER);
    CHECK(tq_index_add(idx, NQ, x, NULL) == TQ_OK);
    CHECK(tq_index_next_id(idx, &next) == TQ_OK && next == 1000 + N + NQ);
  }
  /* add with progress: reported up to total; a cancel leaves the index as it was */
  {
    progress_log log = {0, 0, 0, 0, 0};
    CHECK(tq_index_add_progress(idx, 50, x, NULL, on_progress, &log) == TQ_OK);
    CHECK(log.calls >= 1 && log.last_done == 50 && log.last_total == 50);
    CHECK(tq_index_size(idx) == N + 50);
    CHECK(tq_index_search(idx, NQ, qv, K, 1, s1, i1) == TQ_OK);
    progress_log stop = {0, 0, 1, 0, 0};
    CHECK(tq_index_add_progress(idx, 50, x, NULL, on_progress, &stop) == TQ_ERR_CANCELLED);
    CHECK(strcmp(tq_status_name(TQ_ERR_CANCELLED), "TQ_ERR_CANCELLED") == 0);
    CHECK(strstr(tq_last_error(), "cancelled") != NULL);
    CHECK(tq_index_size(idx) == N + 50);
    CHECK(tq_index_search(idx, NQ, qv, K, 1, s2, i2) == TQ_OK);
    CHECK(memcmp(i1, i2, sizeof i1) == 0 && memcmp(s1, s2, sizeof s1) == 0);
    CHECK(tq_index_add_progress(idx, 50, x, NULL, NULL, NULL) == TQ_OK); /* no callback */
    CHECK(tq_index_add_progress(NULL, 50, x, NULL, NULL, NULL) == TQ_ERR_NULL_POINTER);
    int64_t fifty[100], next = 0;
    CHECK(tq_index_next_id(idx, &next) == TQ_OK);
    for (int i = 0; i < 100; ++i) fifty[i] = next - 100 + i;
    size_t removed = 0;
    CHECK(tq_index_remove_ids(idx, 100, fifty, &removed) == TQ_OK && removed == 100);
    /* holding INT64_MAX: no next id, so no default ids */
    int64_t top = INT64_MAX;
    CHECK(tq_index_add(idx, 1, x, &top) == TQ_OK);
    CHECK(tq_index_next_id(idx, &next) == TQ_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tq_last_error(), "INT64_MAX") != NULL);
    CHECK(tq_index_add(idx, 1, x, NULL) == TQ_ERR_INVALID_ARGUMENT);
    CHECK(tq_index_remove_ids(idx, 1, &top, &removed) == TQ_OK && removed == 1);
  }
  x[7] = INFINITY;
  CHECK(tq_index_add(idx, 1, x, NULL) == TQ_ERR_INVALID_ARGUMENT);
  CHECK(tq_index_size(idx) == N);
  o.metric = "euclid";
  tq_index* bad = NULL;
  CHECK(tq_index_create(D, &o, &bad) == TQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tq_last_error(), "euclid") != NULL);
  tq_index_free(idx);
}

/* f16 cache: attention equals softmax(q.k * scale) v over the cached tokens (f16-rounded
 * K and V, so a 1e-2 tolerance); a tq cache gets close to it. */
static void test_kv(void) {
  enum { L = 2, KVH = 2, H = 4, HD = 64, T = 40 };
  static float k[T * KVH * HD], v[T * KVH * HD], q[H * HD], o16[H * HD], otq[H * HD], ref[H * HD];
  for (int i = 0; i < T * KVH * HD; ++i) {
    k[i] = frand();
    v[i] = frand();
  }
  for (int i = 0; i < H * HD; ++i) q[i] = frand();
  const float scale = 1.0f / sqrtf((float)HD);
  for (int h = 0; h < H; ++h) {
    const int g = h / (H / KVH);
    double w[T], mx = -1e30, sum = 0;
    for (int t = 0; t < T; ++t) {
      double d = 0;
      for (int j = 0; j < HD; ++j) d += (double)q[h * HD + j] * k[(t * KVH + g) * HD + j];
      w[t] = d * scale;
      if (w[t] > mx) mx = w[t];
    }
    for (int t = 0; t < T; ++t) sum += (w[t] = exp(w[t] - mx));
    for (int j = 0; j < HD; ++j) {
      double a = 0;
      for (int t = 0; t < T; ++t) a += w[t] * v[(t * KVH + g) * HD + j];
      ref[h * HD + j] = (float)(a / sum);
    }
  }
  const char* labels[2] = {"f16", "tq4/tq4 plain"};
  float* outs[2] = {o16, otq};
  for (int c = 0; c < 2; ++c) {
    tq_kv_cache* kv = NULL;
    CHECK(tq_kv_cache_create(labels[c], L, KVH, HD, 64, 0.0f, 0, &kv) == TQ_OK);
    if (!kv) continue;
    CHECK(tq_kv_cache_append(kv, 1, T, k, v) == TQ_OK);
    CHECK(tq_kv_cache_n_tokens(kv, 1) == T);
    CHECK(tq_kv_cache_n_tokens(kv, 0) == 0);
    CHECK(tq_kv_cache_n_tokens(kv, 2) == -1);
    CHECK(tq_kv_cache_bytes_used(kv) > 0);
    CHECK(tq_kv_cache_attention(kv, 1, 1, H, q, 0.0f, 1, outs[c]) == TQ_OK);
    CHECK(tq_kv_cache_attention(kv, 1, 1, 3, q, 0.0f, 1, outs[c]) == TQ_ERR_INVALID_ARGUMENT);
    CHECK(tq_kv_cache_append(kv, 1, 100, k, v) == TQ_ERR_INVALID_ARGUMENT); /* past max_tokens */
    CHECK(tq_kv_cache_n_tokens(kv, 1) == T);
    tq_kv_cache_clear(kv);
    CHECK(tq_kv_cache_n_tokens(kv, 1) == 0);
    tq_kv_cache_free(kv);
  }
  double e16 = 0, etq = 0, nr = 0;
  for (int i = 0; i < H * HD; ++i) {
    e16 += (double)(o16[i] - ref[i]) * (o16[i] - ref[i]);
    etq += (double)(otq[i] - ref[i]) * (otq[i] - ref[i]);
    nr += (double)ref[i] * ref[i];
  }
  CHECK(sqrt(e16 / nr) < 1e-2);
  CHECK(sqrt(etq / nr) < 0.2);
  tq_kv_cache* kv = NULL;
  CHECK(tq_kv_cache_create("tq99 plain", L, KVH, HD, 64, 0.0f, 0, &kv) == TQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tq_last_error(), "tq99") != NULL);
  CHECK(tq_kv_cache_create("f16", 0, KVH, HD, 64, 0.0f, 0, &kv) == TQ_ERR_INVALID_ARGUMENT);
  /* a tq K type's automatic protection rotates the K mean with RoPE: without the RoPE, an
   * error that says so; with it, a cache */
  CHECK(tq_kv_cache_create("tq4/tq3", L, KVH, HD, 64, 0.0f, 0, &kv) == TQ_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tq_last_error(), "RoPE") != NULL);
  CHECK(tq_kv_cache_create("tq4/tq3", L, KVH, HD, 64, 10000.0f, HD, &kv) == TQ_OK);
  if (kv) {
    CHECK(tq_kv_cache_append(kv, 0, T, k, v) == TQ_OK);
    CHECK(tq_kv_cache_attention(kv, 0, 1, H, q, 0.0f, 1, otq) == TQ_OK);
    tq_kv_cache_free(kv);
    kv = NULL;
  }
  CHECK(kv == NULL);
  /* NeoX RoPE: a neox cache given rows in the model's order (pairs i, i + HD/2) answers exactly
   * as a normal cache given the same rows interleaved (pairs 2i, 2i + 1), queries likewise. */
  {
    static float ki[T * KVH * HD], qi[H * HD], on[H * HD], oi[H * HD];
    for (int r = 0; r < T * KVH; ++r)
      for (int i = 0; i < HD / 2; ++i) {
        ki[r * HD + 2 * i] = k[r * HD + i];
        ki[r * HD + 2 * i + 1] = k[r * HD + i + HD / 2];
      }
    for (int r = 0; r < H; ++r)
      for (int i = 0; i < HD / 2; ++i) {
        qi[r * HD + 2 * i] = q[r * HD + i];
        qi[r * HD + 2 * i + 1] = q[r * HD + i + HD / 2];
      }
    tq_kv_cache *neox = NULL, *normal = NULL;
    CHECK(tq_kv_cache_create_rope("tq4/tq3", L, KVH, HD, 64, 10000.0f, HD, 1, &neox) == TQ_OK);
    CHECK(tq_kv_cache_create_rope("tq4/tq3", L, KVH, HD, 64, 10000.0f, HD, 0, &normal) == TQ_OK);
    CHECK(tq_kv_cache_create_rope("tq4/tq3", L, KVH, HD, 64, 10000.0f, HD, 2, &kv) == TQ_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tq_last_error(), "rope_neox") != NULL);
    /* a null pointer is reported under the name of the function that was called */
    CHECK(tq_kv_cache_create_rope("tq4/tq3", L, KVH, HD, 64, 10000.0f, HD, 1, NULL) == TQ_ERR_NULL_POINTER);
    CHECK(strstr(tq_last_error(), "tq_kv_cache_create_rope") != NULL);
    CHECK(tq_kv_cache_create(NULL, L, KVH, HD, 64, 10000.0f, HD, &kv) == TQ_ERR_NULL_POINTER);
    CHECK(strstr(tq_last_error(), "tq_kv_cache_create:") != NULL);
    if (neox && normal) {
      CHECK(tq_kv_cache_append(neox, 0, T, k, v) == TQ_OK);
      CHECK(tq_kv_cache_append(normal, 0, T, ki, v) == TQ_OK);
      CHECK(tq_kv_cache_attention(neox, 0, 1, H, q, 0.0f, 1, on) == TQ_OK);
      CHECK(tq_kv_cache_attention(normal, 0, 1, H, qi, 0.0f, 1, oi) == TQ_OK);
      CHECK(memcmp(on, oi, sizeof on) == 0);
      /* and the flag matters: the same neox rows in a normal cache (the wrong pairing for its
       * RoPE-rotating K mean) answer differently */
      tq_kv_cache* wrong = NULL;
      CHECK(tq_kv_cache_create_rope("tq4/tq3", L, KVH, HD, 64, 10000.0f, HD, 0, &wrong) == TQ_OK);
      if (wrong) {
        CHECK(tq_kv_cache_append(wrong, 0, T, k, v) == TQ_OK);
        CHECK(tq_kv_cache_attention(wrong, 0, 1, H, q, 0.0f, 1, oi) == TQ_OK);
        CHECK(memcmp(on, oi, sizeof on) != 0);
      }
      tq_kv_cache_free(wrong);
    }
    tq_kv_cache_free(neox);
    tq_kv_cache_free(normal);
  }
}

/* A cache for a GGUF model: the model's properties choose what "auto" and the automatic
 * protection become (scale-k on the QK-norm Gemma 3, not on SmolLM2), as in the tq commands. */
static int file_exists(const char* p) {
  FILE* f = fopen(p, "rb");
  if (f) fclose(f);
  return f != NULL;
}

static void test_kv_for_model(void) {
  char gemma[4096], smol[4096];
  tq_kv_cache* kv = NULL;
  CHECK(tq_kv_cache_create_for_model("auto", "/nonexistent/model.gguf", 64, &kv) == TQ_ERR_INVALID_ARGUMENT);
  CHECK(kv == NULL);
  CHECK(tq_kv_cache_create_for_model("auto", g_index_path, 64, &kv) == TQ_ERR_INVALID_ARGUMENT); /* not a GGUF */
  CHECK(tq_kv_cache_create_for_model("auto", NULL, 64, &kv) == TQ_ERR_NULL_POINTER);
  CHECK(tq_kv_cache_label(NULL) == NULL);
  if (!g_models_dir) {
    printf("test_kv_for_model: no models directory given; model part skipped\n");
    return;
  }
  snprintf(gemma, sizeof gemma, "%s/gemma-3-270m-q4_k_m.gguf", g_models_dir);
  snprintf(smol, sizeof smol, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", g_models_dir);
  if (!file_exists(gemma) || !file_exists(smol)) {
    printf("test_kv_for_model: %s or %s missing (scripts/fetch-model.sh); model part skipped\n", gemma, smol);
    return;
  }
  CHECK(tq_kv_cache_create_for_model("auto", gemma, 0, &kv) == TQ_ERR_INVALID_ARGUMENT);
  CHECK(tq_kv_cache_create_for_model("tq99", gemma, 64, &kv) == TQ_ERR_INVALID_ARGUMENT);
  CHECK(tq_kv_cache_create_for_model("auto", gemma, 64, &kv) == TQ_OK);
  if (kv) {
    enum { T = 40, HD = 256, H = 4 }; /* Gemma 3 270M: 1 KV head of 256, 4 query heads */
    static float k[T * HD], v[T * HD], q[H * HD], out[H * HD];
    CHECK(strstr(tq_kv_cache_label(kv), "k=tq4h6n8 v=tq3h6n8") != NULL);
    CHECK(strstr(tq_kv_cache_label(kv), "scale-k") != NULL);
    for (int i = 0; i < T * HD; ++i) k[i] = frand(), v[i] = frand();
    for (int i = 0; i < H * HD; ++i) q[i] = frand();
    CHECK(tq_kv_cache_append(kv, 5, T, k, v) == TQ_OK);
    CHECK(tq_kv_cache_n_tokens(kv, 5) == T);
    CHECK(tq_kv_cache_attention(kv, 5, 1, H, q, 0.0f, 1, out) == TQ_OK);
    CHECK(isfinite(out[0]) && isfinite(out[H * HD - 1]));
    CHECK(tq_kv_cache_n_tokens(kv, 18) == -1); /* 18 layers */
    tq_kv_cache_free(kv);
    kv = NULL;
  }
  CHECK(tq_kv_cache_create_for_model("tq4/tq3", smol, 64, &kv) == TQ_OK);
  if (kv) {
    CHECK(strstr(tq_kv_cache_label(kv), "k=tq4 v=tq3") != NULL);
    CHECK(strstr(tq_kv_cache_label(kv), "scale-k") == NULL);
    tq_kv_cache_free(kv);
  }
}

/* Exact top-1 by inner product over x (n rows of D floats), the reference for recall. */
static int exact_top1_ip(const float* x, int n, int d, const float* q) {
  int best = 0;
  double bs = -1e300;
  for (int i = 0; i < n; ++i) {
    double s = 0;
    for (int j = 0; j < d; ++j) s += (double)x[i * d + j] * q[j];
    if (s > bs) bs = s, best = i;
  }
  return best;
}

/* IVF and trellis indexes, and every search option, through the C API. */
static void test_index_ivf_trellis(void) {
  enum { D = 32, N = 2000, NQ = 40, K = 10, NLIST = 8 };
  static float x[N * D], qv[NQ * D], s1[NQ * K], s2[NQ * K];
  static int64_t i1[NQ * K], i2[NQ * K];
  /* 16 clusters, so that IVF lists are meaningful */
  static float c[16 * D];
  for (int i = 0; i < 16 * D; ++i) c[i] = frand();
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < D; ++j) x[i * D + j] = c[(i % 16) * D + j] + 0.3f * frand();
  for (int i = 0; i < NQ * D; ++i) qv[i] = c[(i / D) % 16 * D + i % D] + 0.3f * frand();

  tq_index_options o = tq_index_options_default();
  CHECK(o.trellis == 0 && o.nlist == 0 && o.kmeans_iters == 10 && o.rerank_bits == 0);
  o.metric = "ip";
  o.nlist = NLIST;
  o.rerank_bits = 4;
  tq_index* ivf = NULL;
  CHECK(tq_index_create(D, &o, &ivf) == TQ_OK);
  if (ivf) {
    CHECK(tq_index_add(ivf, N, x, NULL) == TQ_OK);
    CHECK(tq_index_nlist(ivf) == NLIST);
    tq_search_params p = tq_search_params_default();
    CHECK(p.k == 10 && p.nprobe == 1 && p.rerank == -1 && p.rerank_full == 0 && p.fast_scan == 1);
    p.k = K;
    p.n_threads = 1;
    /* recall@10 of the exact top-1: all lists against one list (one can only lose neighbours) */
    int hit_all = 0, hit_one = 0;
    p.nprobe = NLIST;
    CHECK(tq_index_search_with(ivf, NQ, qv, &p, s1, i1) == TQ_OK);
    p.nprobe = 1;
    CHECK(tq_index_search_with(ivf, NQ, qv, &p, s2, i2) == TQ_OK);
    for (int i = 0; i < NQ; ++i) {
      const int want = exact_top1_ip(x, N, D, qv + i * D);
      for (int j = 0; j < K; ++j) {
        hit_all += i1[i * K + j] == want;
        hit_one += i2[i * K + j] == want;
      }
      CHECK(s1[i * K] >= s1[i * K + K - 1]); /* ip: descending scores */
    }
    CHECK(hit_all >= NQ * 9 / 10);
    CHECK(hit_all >= hit_one);
    /* tq_index_search is tq_index_search_with at nprobe 1 */
    CHECK(tq_index_search(ivf, NQ, qv, K, 1, s1, i1) == TQ_OK);
    CHECK(memcmp(i1, i2, sizeof i1) == 0 && memcmp(s1, s2, sizeof s1) == 0);
    /* the file keeps the lists: same results after a round trip */
    CHECK(tq_index_save(ivf, g_index_path) == TQ_OK);
    tq_index* back = NULL;
    CHECK(tq_index_load(g_index_path, &back) == TQ_OK);
    remove(g_index_path);
    if (back) {
      CHECK(tq_index_nlist(back) == NLIST);
      CHECK(tq_index_search_with(back, NQ, qv, &p, s1, i1) == TQ_OK);
      CHECK(memcmp(i1, i2, sizeof i1) == 0 && memcmp(s1, s2, sizeof s1) == 0);
      tq_index_free(back);
    }
    p.nprobe = NLIST + 1;
    CHECK(tq_index_search_with(ivf, NQ, qv, &p, s1, i1) == TQ_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tq_last_error(), "nprobe") != NULL);
    p.nprobe = 0;
    CHECK(tq_index_search_with(ivf, NQ, qv, &p, s1, i1) == TQ_ERR_INVALID_ARGUMENT);
    tq_index_free(ivf);
  }
  CHECK(tq_index_search_with(NULL, NQ, qv, NULL, s1, i1) == TQ_ERR_NULL_POINTER);
  CHECK(tq_index_nlist(NULL) == 0);
  CHECK(tq_index_has_sign_plane(NULL) == 0);
  CHECK(tq_index_release_sign_plane(NULL) == TQ_ERR_NULL_POINTER);

  /* fit_scale and center -1 (the defaults): on for a flat mse index, off for IVF, as the CLI */
  {
    const int nls[2] = {0, NLIST};
    for (int t = 0; t < 2; ++t) {
      tq_index *dflt = NULL, *expl = NULL;
      o = tq_index_options_default();
      CHECK(o.fit_scale == -1 && o.center == -1);
      o.nlist = nls[t];
      CHECK(tq_index_create(D, &o, &dflt) == TQ_OK);
      o.fit_scale = o.center = nls[t] == 0 ? 1 : 0;
      CHECK(tq_index_create(D, &o, &expl) == TQ_OK);
      if (dflt && expl) {
        CHECK(tq_index_add(dflt, N, x, NULL) == TQ_OK && tq_index_add(expl, N, x, NULL) == TQ_OK);
        CHECK(tq_index_search(dflt, NQ, qv, K, 1, s1, i1) == TQ_OK);
        CHECK(tq_index_search(expl, NQ, qv, K, 1, s2, i2) == TQ_OK);
        CHECK(memcmp(i1, i2, sizeof i1) == 0 && memcmp(s1, s2, sizeof s1) == 0);
      }
      tq_index_free(dflt);
      tq_index_free(expl);
    }
    tq_index* bad = NULL;
    o = tq_index_options_default();
    o.fit_scale = 2;
    CHECK(tq_index_create(D, &o, &bad) == TQ_ERR_INVALID_ARGUMENT && bad == NULL);
    CHECK(strstr(tq_last_error(), "fit_scale") != NULL);
    o = tq_index_options_default();
    o.nlist = NLIST;
    o.center = 1; /* IVF lists replace the mean */
    CHECK(tq_index_create(D, &o, &bad) == TQ_ERR_INVALID_ARGUMENT && bad == NULL);
  }

  /* trellis: flat, its own scan; the exact re-rank of every candidate equals the float path */
  o = tq_index_options_default();
  o.metric = "ip";
  o.trellis = 1;
  tq_index* tr = NULL;
  CHECK(tq_index_create(D, &o, &tr) == TQ_OK);
  if (tr) {
    CHECK(tq_index_add(tr, N, x, NULL) == TQ_OK);
    CHECK(tq_index_nlist(tr) == 0);
    tq_search_params p = tq_search_params_default();
    p.k = K;
    p.n_threads = 1;
    p.rerank = N;
    CHECK(tq_index_search_with(tr, NQ, qv, &p, s1, i1) == TQ_OK);
    p.fast_scan = 0;
    CHECK(tq_index_search_with(tr, NQ, qv, &p, s2, i2) == TQ_OK);
    CHECK(memcmp(i1, i2, sizeof i1) == 0);
    int hit = 0;
    for (int i = 0; i < NQ; ++i) {
      const int want = exact_top1_ip(x, N, D, qv + i * D);
      for (int j = 0; j < K; ++j) hit += i1[i * K + j] == want;
    }
    CHECK(hit >= NQ * 9 / 10);
    p.nprobe = 2; /* a flat index has no lists to probe */
    CHECK(tq_index_search_with(tr, NQ, qv, &p, s1, i1) == TQ_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tq_last_error(), "IVF") != NULL);
    tq_index_free(tr);
  }
  o.bits = 5; /* trellis codes are 1-4 bits */
  tr = NULL;
  CHECK(tq_index_create(D, &o, &tr) == TQ_ERR_INVALID_ARGUMENT && tr == NULL);
  CHECK(strstr(tq_last_error(), "trellis") != NULL);
  o.bits = 4;
  o.nlist = NLIST; /* and flat only */
  CHECK(tq_index_create(D, &o, &tr) == TQ_ERR_INVALID_ARGUMENT && tr == NULL);
  o = tq_index_options_default();
  o.rerank_bits = 4; /* a second-stage code needs IVF */
  CHECK(tq_index_create(D, &o, &tr) == TQ_ERR_INVALID_ARGUMENT && tr == NULL);
  CHECK(strstr(tq_last_error(), "rerank_bits") != NULL);
}

/* The two-level scan through tq_search_params (d >= 384, 4 bits; flat and IVF). */
static void test_index_two_level(void) {
  enum { D = 400, N = 600, NQ = 8, K = 5 };
  static float x[N * D], qv[NQ * D], s1[NQ * K], s2[NQ * K];
  static int64_t i1[NQ * K], i2[NQ * K];
  for (int i = 0; i < N * D; ++i) x[i] = frand();
  for (int i = 0; i < NQ * D; ++i) qv[i] = x[i] + 0.1f * frand(); /* near the first rows */
  for (int nlist = 0; nlist <= 4; nlist += 4) {
    tq_index_options o = tq_index_options_default();
    o.metric = "l2";
    o.nlist = nlist;
    tq_index* idx = NULL;
    CHECK(tq_index_create(D, &o, &idx) == TQ_OK);
    if (!idx) continue;
    CHECK(tq_index_add(idx, N, x, NULL) == TQ_OK);
    tq_search_params p = tq_search_params_default();
    CHECK(p.two_level == -1);
    p.k = K;
    p.nprobe = nlist ? 2 : 1;
    /* auto is on at this d and width: the same results as 1 */
    CHECK(tq_index_search_with(idx, NQ, qv, &p, s1, i1) == TQ_OK);
    p.two_level = 1;
    CHECK(tq_index_search_with(idx, NQ, qv, &p, s2, i2) == TQ_OK);
    CHECK(memcmp(i1, i2, sizeof i1) == 0 && memcmp(s1, s2, sizeof s1) == 0);
    /* each query's nearest row is its own first, both ways */
    p.two_level = 0;
    CHECK(tq_index_search_with(idx, NQ, qv, &p, s2, i2) == TQ_OK);
    for (int i = 0; i < NQ; ++i) CHECK(i1[i * K] == i && i2[i * K] == i);
    p.two_level = 2;
    CHECK(tq_index_search_with(idx, NQ, qv, &p, s1, i1) == TQ_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tq_last_error(), "two_level") != NULL);
    p.two_level = 1;
    p.fast_scan = 0; /* the plane is read by the uint8 scan */
    CHECK(tq_index_search_with(idx, NQ, qv, &p, s1, i1) == TQ_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tq_last_error(), "two_level 1 needs") != NULL);
    /* Releasing the plane: the single-level results unchanged, auto is now one level, 1 an error */
    p.fast_scan = 1;
    p.two_level = 0;
    CHECK(tq_index_search_with(idx, NQ, qv, &p, s1, i1) == TQ_OK);
    CHECK(tq_index_has_sign_plane(idx) == 1);
    CHECK(tq_index_release_sign_plane(idx) == TQ_OK);
    CHECK(tq_index_has_sign_plane(idx) == 0);
    CHECK(tq_index_release_sign_plane(idx) == TQ_OK); /* again: a no-op */
    CHECK(tq_index_search_with(idx, NQ, qv, &p, s2, i2) == TQ_OK);
    CHECK(memcmp(i1, i2, sizeof i1) == 0 && memcmp(s1, s2, sizeof s1) == 0);
    p.two_level = -1;
    CHECK(tq_index_search_with(idx, NQ, qv, &p, s2, i2) == TQ_OK);
    CHECK(memcmp(i1, i2, sizeof i1) == 0 && memcmp(s1, s2, sizeof s1) == 0);
    p.two_level = 1;
    CHECK(tq_index_search_with(idx, NQ, qv, &p, s2, i2) == TQ_ERR_INVALID_ARGUMENT);
    tq_index_free(idx);
  }
}

int main(int argc, char** argv) {
  if (argc > 1) g_index_path = argv[1];
  if (argc > 2) g_models_dir = argv[2];
  test_errors();
  test_codec();
  test_index();
  test_index_ivf_trellis();
  test_index_two_level();
  test_kv();
  test_kv_for_model();
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed ? 1 : 0;
}
