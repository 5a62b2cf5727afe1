// Attention over the KV cache: the driver (tasks over kv heads x KV-length chunks, merged
// with log-sum-exp), the generic float path (decode a block of rows in the stream's domain,
// then exact online softmax; used for formats and levels without a fused kernel, the f16
// window and the sinks) and attention_ref (dequantize every row to the original domain, then exact
// attention in double: the oracle).
//
// Fused SIMD kernels (f16 rows, tq bit-plane codes) live in attention_simd.cpp.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <limits>
#include <memory>
#include <vector>

#include "kv/attention_kernels.h"
#include "kv/kv_internal.h"
#include "tq/error.h"
#include "tq/simd.h"

namespace tq {
namespace kv {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Generic task: queries qd (n_q x G x D, in the K domain), tokens [a, b) of one segment,
// rows fetched by `fetch(t0, n, kbuf, vbuf)` in the (K domain, V domain). Query i sees tokens
// [lows[i], limits[i]) of them (lows: null for none; the coordinates of limits).
template <class Fetch>
void generic_task(const Shape& sh, const float* qd, const int* limits, int a, int b, Fetch&& fetch,
                  const States& st, const int* lows = nullptr) {
  const int D = sh.D, G = sh.G;
  const bool scalar = simd::use_scalar();
  std::vector<float> kb((size_t)kBlock * D), vb((size_t)kBlock * D), s(kBlock);
  for (int t = a; t < b; t += kBlock) {
    const int nb = std::min(kBlock, b - t);
    auto first_row = [&](int i) { return lows ? std::clamp(lows[i] - t, 0, nb) : 0; };
    bool any = false, later = false;
    for (int i = 0; i < sh.n_q; ++i) {
      any |= limits[i] > t && first_row(i) < std::min(nb, limits[i] - t);
      later |= limits[i] > t;
    }
    if (!later) break;
    if (!any) continue;
    fetch(t, nb, kb.data(), vb.data());
    for (int i = 0; i < sh.n_q; ++i) {
      const int r0 = first_row(i), nt = std::min(nb, limits[i] - t) - r0;
      if (nt <= 0) continue;
      const float* kr0 = kb.data() + (size_t)r0 * D;
      const float* vr0 = vb.data() + (size_t)r0 * D;
      if (!scalar) {
        attend_rows(D, G, sh.scale, qd + (size_t)i * G * D, kr0, vr0, nt,
                    States{st.base + (size_t)i * G * st.stride(), D});
        continue;
      }
      for (int g = 0; g < G; ++g) {
        const float* qv = qd + ((size_t)i * G + g) * D;
        const int k = i * G + g;
        float mx = kNegInf;
        for (int j = 0; j < nt; ++j) {
          const float* kr = kr0 + (size_t)j * D;
          float acc = 0;
          for (int d = 0; d < D; ++d) acc += qv[d] * kr[d];
          s[j] = acc * sh.scale;
          mx = std::max(mx, s[j]);
        }
        const float m_new = std::max(st.m(k), mx);
        const float alpha = st.m(k) == kNegInf ? 0.f : std::exp(st.m(k) - m_new);
        float lsum = 0;
        for (int j = 0; j < nt; ++j) { s[j] = std::exp(s[j] - m_new); lsum += s[j]; }
        st.l(k) = st.l(k) * alpha + lsum;
        st.m(k) = m_new;
        float* o = st.acc(k);
        for (int d = 0; d < D; ++d) o[d] *= alpha;
        for (int j = 0; j < nt; ++j) {
          const float* vr = vr0 + (size_t)j * D;
          const float pj = s[j];
          for (int d = 0; d < D; ++d) o[d] += pj * vr[d];
        }
      }
    }
  }
}

// Merge state (b, kb) into (a, ka) (same domain), log-sum-exp style.
void merge_state(const States& a, int ka, const States& b, int kb) {
  const int D = a.D;
  if (b.m(kb) == kNegInf) return;
  if (a.m(ka) == kNegInf) {
    a.m(ka) = b.m(kb); a.l(ka) = b.l(kb);
    std::memcpy(a.acc(ka), b.acc(kb), sizeof(float) * D);
    return;
  }
  const float m = std::max(a.m(ka), b.m(kb));
  const float fa = std::exp(a.m(ka) - m), fb = std::exp(b.m(kb) - m);
  a.l(ka) = a.l(ka) * fa + b.l(kb) * fb;
  float* x = a.acc(ka);
  const float* y = b.acc(kb);
  for (int d = 0; d < D; ++d) x[d] = x[d] * fa + y[d] * fb;
  a.m(ka) = m;
}

struct Prepared {
  Shape sh;
  std::vector<int> limits;
};

Prepared prepare(const KvCache& cache, int layer, int n_q, const float* q, const float* out,
                 const AttentionParams& p) {
  const auto& cfg = cache.config();
  TQ_CHECK(layer >= 0 && layer < cfg.n_layers, "attention: layer %d out of range [0, %d)", layer, cfg.n_layers);
  TQ_CHECK(n_q >= 0, "attention: negative query count %d", n_q);
  TQ_CHECK(p.n_heads >= 1 && p.n_heads % cfg.n_kv_heads == 0,
           "attention: n_heads %d is not a positive multiple of n_kv_heads %d", p.n_heads, cfg.n_kv_heads);
  TQ_CHECK(n_q == 0 || (q && out), "attention: null q or out");
  const auto& I = cache.impl();
  const Layer& L = I.layers[layer];
  Prepared P;
  P.sh.D = cfg.head_dim;
  P.sh.H = p.n_heads;
  P.sh.KVH = cfg.n_kv_heads;
  P.sh.G = p.n_heads / cfg.n_kv_heads;
  P.sh.n_q = n_q;
  P.sh.n_tokens = L.n_tokens;
  P.sh.n_quant = L.k.empty() ? 0 : L.k[0].n_quant;
  P.sh.scale = p.scale != 0 ? p.scale : 1.0f / std::sqrt((float)cfg.head_dim);
  int pos0 = p.pos0;
  if (pos0 < 0) {
    TQ_CHECK(pos0 == -1, "attention: pos0 %d invalid (use -1 or a position >= 0)", pos0);
    pos0 = L.n_tokens - n_q;
  } else {
    TQ_CHECK((int64_t)pos0 + n_q <= L.n_tokens,
             "attention: queries at positions %d..%d but layer %d holds %d tokens", pos0, pos0 + n_q - 1,
             layer, L.n_tokens);
  }
  P.limits.resize(n_q);
  for (int i = 0; i < n_q; ++i) P.limits[i] = std::clamp(pos0 + i + 1, 0, L.n_tokens);
  return P;
}

}  // namespace

// ------------------------------------------------------------------ kernel choice
const char* kernel_name(Kernel k) {
  static const char* const n[] = {"rows", "f16", "tq-float", "tq-lut8"};
  return n[(int)k];
}

namespace {
// The tq kernels read (sk, sv) here: the traits table's kernel masks (lut8: parts of <= 6 bits,
// 64-byte vpermb tables; float: <= 8 bits), chosen channels, the head size and the SIMD level
// (TQ_SIMD / --simd): lut8 needs VNNI + VBMI + VBMI2 and the avx3_dl level, the float kernel
// runs at every Highway level with 4-16 float lanes (not scalar).
bool tq_runs(const Shape& sh, const Stream& sk, const Stream& sv, bool lut8) {
  const uint8_t need = lut8 ? kKvKernelTqLut8 : kKvKernelTqFloat;
  if (!(sk.fmt->kernels_k & need) || !(sv.fmt->kernels_v & need)) return false;
  for (const Stream* s : {&sk, &sv}) {
    if (s->channels.open()) return false;
    // Trellis codes: the float kernel needs 8+ float lanes (a V window reaches up to 7 lanes
    // back); lut8 reads them with 256-entry tables (score_block_t, accum_block_t).
    if (s->trellis_coded() && !lut8 && decode_tq_float_lanes() < 8) return false;
  }
  if (sh.D % 16 != 0 || sh.D > kMaxHeadDim) return false;
  // This runs per task: the float check reads an atomic, only lut8 asks for the level name.
  if (lut8) return lut8_host_ok() && simd::current_level() == "avx3_dl";
  return decode_tq_float_lanes() >= 4;
}
}  // namespace

Kernel pick_kernel(const Shape& sh, const Stream& sk, const Stream& sv, AttnKernel want) {
  if (want == AttnKernel::reference || simd::use_scalar()) return Kernel::rows;
  if ((sk.fmt->kernels_k & kKvKernelF16) && (sv.fmt->kernels_v & kKvKernelF16))
    return sh.D % 16 == 0 ? Kernel::f16 : Kernel::rows;  // DecodeF16: the vector length divides D
  // lut8 is a permission: where the int8 kernel cannot run, the float kernel does.
  if (want == AttnKernel::lut8 && tq_runs(sh, sk, sv, true)) return Kernel::tq_lut8;
  if (tq_runs(sh, sk, sv, false)) return Kernel::tq_float;
  return Kernel::rows;
}

namespace {
// fused_decode for a G with a kernel instance.
bool fused_group(const Shape& sh, const Stream& sk, const Stream& sv, Kernel k, int nq, const float* qd,
                 const int* limits, int a, int b, const States& st) {
  switch (k) {
    case Kernel::f16:
      return decode_f16(sh, sk, sv, nq, qd, limits, a, b, st);
    case Kernel::tq_float: return decode_tq_float(sh, sk, sv, nq, qd, limits, a, b, st);
    case Kernel::tq_lut8: return decode_tq_lut8(sh, sk, sv, nq, qd, limits, a, b, st);
    case Kernel::rows: break;
  }
  return false;
}
}  // namespace

bool fused_decode(const Shape& sh, const Stream& sk, const Stream& sv, Kernel k, int nq, const float* qd,
                  const int* limits, int a, int b, const States& st) {
  // The f16 kernel takes any number of rows (its passes span queries), so any G in one call.
  if (k == Kernel::f16 || has_kernel_instance(sh.G)) return fused_group(sh, sk, sv, k, nq, qd, limits, a, b, st);
  // Heads g0 .. g0 + gs - 1 of every query: their query rows, states and RoPE-mean coefficients
  // copied to rows i gs + g, a call with G = gs, the states copied back. Whether a kernel runs
  // depends on the types only, so a false comes from the first subgroup, before any copy-back.
  const int G = sh.G, qs = sh.D, ms = sh.rope_mc ? rope_mc_stride(sk) : 0;
  const size_t ss = st.stride();
  thread_local std::vector<float> q, s, mc;
  for (int g0 = 0, gs; g0 < G; g0 += gs) {
    gs = kernel_subgroup(G - g0);
    const size_t rows = (size_t)nq * gs;
    q.resize(rows * qs);
    s.resize(rows * ss);
    mc.resize(rows * ms);
    for (int i = 0; i < nq; ++i)
      for (int g = 0; g < gs; ++g) {
        const size_t from = (size_t)i * G + g0 + g, to = (size_t)i * gs + g;
        std::memcpy(&q[to * qs], qd + from * qs, sizeof(float) * qs);
        std::memcpy(&s[to * ss], st.base + from * ss, sizeof(float) * ss);
        if (ms) std::memcpy(&mc[to * ms], sh.rope_mc + from * ms, sizeof(float) * ms);
      }
    Shape sub = sh;
    sub.G = gs;
    sub.H = sh.KVH * gs;
    sub.rope_mc = ms ? mc.data() : nullptr;
    if (!fused_group(sub, sk, sv, k, nq, q.data(), limits, a, b, States{s.data(), st.D})) {
      TQ_ASSERT(g0 == 0);
      return false;
    }
    for (int i = 0; i < nq; ++i)
      for (int g = 0; g < gs; ++g)
        std::memcpy(st.base + ((size_t)i * G + g0 + g) * ss, &s[((size_t)i * gs + g) * ss], sizeof(float) * ss);
  }
  return true;
}

// ------------------------------------------------------------------ driver
// starts: per query, the first absolute position it sees (sliding windows; null: all from 0),
// nondecreasing, and in stream coordinates (after the sinks) all in one 32-token block (from
// its second token on) or its end, or all equal: the queries share the blocks after that one.
// Tokens before a query's start are skipped; the quantized block the starts cut runs on the
// generic float path from each query's start (lut8: its kernel takes the whole block, each
// query's rows masked before its start), the fused kernels take the blocks after it together.
void run_attention(const KvCache& cache, int layer, int n_q, const float* q, float* out,
                   const AttentionParams& p, const int* starts) {
  Prepared P = prepare(cache, layer, n_q, q, out, p);
  if (n_q == 0) return;
  const Shape& sh = P.sh;
  const auto& I = cache.impl();
  const Layer& L = I.layers[layer];
  const int D = sh.D, G = sh.G, KVH = sh.KVH;
  const int W = I.cfg.window;
  const size_t state_floats = (size_t)D + 16;
  // Absolute positions: [0, n_sink) f16 sinks, [q0, q0 + nq_tok) quantized blocks (stream
  // index j at position q0 + j), [q0 + nq_tok, n_tokens) the f16 window.
  const int S = I.cfg.sink;
  const int n_sink = std::min(sh.n_tokens, S);
  const int q0 = n_sink;
  const int nq_tok = sh.n_quant;
  const int n_win = sh.n_tokens - n_sink - nq_tok;
  // Centred K: the tasks score q.(k - mu_k) and shift each query row's running max by
  // scale * q.mu_k around every K mean segment (exact), so one task covers many K segments.
  // Segmented V means are added in the original domain: then a task covers one V segment.
  // (Per KV head: the heads of a layer may have different types, f16 ones are never centred.)
  // V means per segment: the chunks follow the segments of every head (uncentred heads too).
  int vseg = 0;
  for (const Stream& sv : L.v) vseg = std::max(vseg, sv.centre.segment);
  const int chunk = vseg > 0 ? vseg : kChunkTokens;
  const int n_chunks = (nq_tok + chunk - 1) / chunk;
  const int task_win = n_win > 0 ? n_chunks : -1, task_sink = n_chunks + (n_win > 0 ? 1 : 0);
  const int tasks_per_head = task_sink + (n_sink > 0 ? 1 : 0);
  // Causal limits of the queries in stream coordinates of the quantized blocks.
  std::vector<int> qlimits(n_q);
  for (int i = 0; i < n_q; ++i) qlimits[i] = std::clamp(P.limits[i] - q0, 0, nq_tok);
  // The window's starts in stream coordinates; qstart: the least.
  std::vector<int> qlows(starts ? n_q : 0);
  for (size_t i = 0; i < qlows.size(); ++i) qlows[i] = std::clamp(starts[i] - q0, 0, nq_tok);
  const int start = starts ? starts[0] : 0, qstart = starts ? qlows[0] : 0;
  const bool one_start = !starts || qlows.back() == qstart;  // in the quantized blocks
  const bool one_abs_start = !starts || starts[n_q - 1] == start;
  if (!one_start) {
    const int e = (qstart / kBlock + 1) * kBlock;  // the cut block's end
    TQ_ASSERT(qstart % kBlock != 0 && qlows.back() <= e);
    for (int i = 1; i < n_q; ++i) TQ_ASSERT(starts[i] >= starts[i - 1]);
  }
  const int dropped = nq_tok > 0 ? L.k[0].n_dropped : 0;  // the same in every stream of a layer
  TQ_CHECK(qstart >= dropped,
           "attention: layer %d keeps tokens from position %d on (sliding window %d); a query that "
           "sees from position %d needs dropped ones", layer, q0 + dropped,
           I.cfg.layer_window.empty() ? 0 : I.cfg.layer_window[layer], start);
  const int n_tasks = KVH * tasks_per_head;
  const size_t per_task = (size_t)n_q * G * state_floats;
  // Not zeroed: every task that runs resets its states, and the merge skips the chunks before the
  // window's start (chunk_runs), whose tasks do nothing (a sliding-window layer's decode step
  // zeroed 16 chunks' states, 74 KB, for the one or two it reads: 7% of the call).
  std::unique_ptr<float[]> states(new float[std::max<size_t>(1, (size_t)n_tasks * per_task)]);
  auto chunk_runs = [&](int c) { return std::min(nq_tok, c * chunk + chunk) > qstart; };
  // Queries in each kv head's K domain (quantized part) and original domain (window).
  std::vector<float> qk((size_t)KVH * n_q * G * D), qo((size_t)KVH * n_q * G * D);
  for (int h = 0; h < KVH; ++h) {
    float* qoh = &qo[(size_t)h * n_q * G * D];
    for (int i = 0; i < n_q; ++i)
      for (int g = 0; g < G; ++g)
        std::memcpy(qoh + ((size_t)i * G + g) * D, q + ((size_t)i * sh.H + h * G + g) * D, sizeof(float) * D);
    if (nq_tok > 0) L.k[h].query_to_domain(n_q * G, qoh, &qk[(size_t)h * n_q * G * D]);
  }
  const int n_threads = p.n_threads > 0 ? p.n_threads : omp_get_max_threads();
  // Small calls (short contexts: a few microseconds of work) run on the calling thread: an
  // OpenMP fork/join costs about as much as the work there. 4096 token-heads (e.g. one query
  // over 1366+ tokens with 3 kv heads) is ~0.1 ms of work: with the CLI's short spin
  // (GOMP_SPINCOUNT, tools/tq/llm_cli.h) the model's 4K decode went 79.8 -> 99.8 tok/s (f16)
  // and 69.3 -> 97.7 (tq5/tq3) at 2 threads when this limit moved down from 16384. The tokens
  // counted are the ones the queries see: a sliding-window layer's call (gemma3: 512 tokens)
  // is small however long the context, and most of its tasks would find nothing to do.
  const bool parallel =
      n_threads > 1 && n_tasks > 1 && (int64_t)n_q * (sh.n_tokens - std::clamp(start, 0, sh.n_tokens)) * KVH >= 4096;

#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) if (parallel)
  for (int task = 0; task < n_tasks; ++task) {
    const int h = task / tasks_per_head, c = task % tasks_per_head;
    if (c < n_chunks && !chunk_runs(c)) continue;
    const States st{&states[(size_t)task * per_task], D};
    for (int k = 0; k < n_q * G; ++k) st.reset(k);
    const Stream& sk = L.k[h];
    const Stream& sv = L.v[h];
    const int kseg = sk.centre.on ? sk.centre.segment : -1;  // -1 not centred, 0 one mean
    if (c < n_chunks) {
      const int a0 = c * chunk, b = std::min(nq_tok, a0 + chunk);  // b > qstart (chunk_runs)
      const int a = std::max(a0, qstart);
      const float* qd = &qk[(size_t)h * n_q * G * D];
      // Fused kernels take the queries that see some of the range together (each with its own
      // causal limit); whether one applies depends only on the types. Queries that see none of
      // [a, b) keep reset states.
      const Kernel kern = pick_kernel(sh, sk, sv, p.kernel);
      auto fetch = [&](int t0, int n, float* kb, float* vb) {
        sk.decode_domain(t0, n, kb);
        sv.decode_domain(t0, n, vb);
      };
      auto first_seeing = [&](int i, int t) {  // the first query from i on that sees token t
        while (i < n_q && qlimits[i] <= t) ++i;
        return i;
      };
      const int i0 = first_seeing(0, a);
      if (i0 == n_q) continue;
      const int mst = sk.centre.rope ? rope_mc_stride(sk) : 1;
      // Tokens [lo, hi) (one K mean) into the states: a fused kernel (with the rope mean
      // coefficients mc of the query rows, or null), else rows of queries qg fetched by fetch_g.
      auto run_range = [&](int lo, int hi, const float* qg, auto&& fetch_g, const float* mc) {
        // A block cut by the window's starts (sliding-window layers: the queries after the
        // first W, in groups whose starts cut one block). The lut8 kernel takes the whole block
        // and masks the tokens before each query's start (Shape::first, or Shape::firsts when
        // the starts differ); the others get each query's rows from its start on the
        // generic path (for a rope-centred K: decoded, turned back to the original domain and
        // each row's mean added, once per call; the float kernel keeps this exact path, see
        // docs/design.md "Sliding-window attention").
        int from = lo;
        if (lo % kBlock != 0) {
          if (kern == Kernel::tq_lut8) {
            from = lo / kBlock * kBlock;
          } else {
            const int e = std::min(hi, (lo / kBlock + 1) * kBlock);
            generic_task(sh, qg, qlimits.data(), lo, e, fetch_g, st, starts ? qlows.data() : nullptr);
            if ((lo = from = e) >= hi) return;
          }
        }
        const int j0 = first_seeing(i0, lo);
        if (j0 == n_q) return;
        Shape shf = sh;
        if (mc) shf.rope_mc = mc + (size_t)j0 * G * mst;
        if (from < lo) {
          if (one_start) shf.first = lo;
          else shf.firsts = qlows.data() + j0;
        }
        if (kern != Kernel::rows && fused_decode(shf, sk, sv, kern, n_q - j0, qd + (size_t)j0 * G * D, &qlimits[j0],
                                                 from, hi, States{st.base + (size_t)j0 * G * st.stride(), D}))
          return;
        generic_task(sh, qg, qlimits.data(), lo, hi, fetch_g, st, starts ? qlows.data() : nullptr);
      };
      if (kseg < 0) {
        run_range(a, b, qd, fetch, nullptr);
        continue;
      }
      // Centred K, one mean per segment [lo, hi). Constant mean: the running maxima of the query
      // rows that see the segment are shifted by scale * q.mu_k around it (exact). RoPE-rotating
      // mean (Centre::rope): the fused kernels add each token's mean logit from the coefficients of
      // the query rows (rope_mean_coefs); without a fused kernel, rows in the original domain
      // (decoded + mean_at) against the original-domain queries; V stays in its domain.
      const float* qh = &qo[(size_t)h * n_q * G * D];
      std::vector<float> coef((size_t)n_q * G * mst);  // per query row: kshift, or rope coefficients
      auto fetch_orig = [&](int t0, int n, float* kb, float* vb) {
        sk.decode_domain(t0, n, kb);
        sk.to_orig(t0, n, kb);
        sv.decode_domain(t0, n, vb);
      };
      for (int lo = a, hi; lo < b; lo = hi) {
        hi = kseg > 0 ? std::min(b, (lo / kseg + 1) * kseg) : b;
        const int j0 = first_seeing(i0, lo);
        if (j0 == n_q) break;
        const float* mu = sk.centre.mu_of(lo);
        if (sk.centre.rope) {
          for (int i = j0; i < n_q; ++i) rope_mean_coefs(sk, G, qh + (size_t)i * G * D, mu, &coef[(size_t)i * G * mst]);
          run_range(lo, hi, qh, fetch_orig, coef.data());
          continue;
        }
        for (int k = j0 * G; k < n_q * G; ++k) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += (double)qh[(size_t)k * D + d] * mu[d];
          coef[k] = (float)(dot * sh.scale);
          st.m(k) -= coef[k];  // -inf stays -inf
        }
        run_range(lo, hi, qd, fetch, nullptr);
        for (int k = j0 * G; k < n_q * G; ++k) st.m(k) += coef[k];
      }
    } else {  // the f16 window (task_win) or sinks (task_sink), original domain
      const bool win = c == task_win;
      TQ_ASSERT(win || c == task_sink);
      auto row = [&](const Stream& s, int t) {  // window slot of absolute position t, or sink row t
        return win ? s.ring.get() + (size_t)((t - S) % W) * D : s.sink_rows.get() + (size_t)t * D;
      };
      auto fetch = [&](int t0, int n, float* kb, float* vb) {
        for (int r = 0; r < n; ++r) {
          f16_to_f32(D, row(sk, t0 + r), kb + (size_t)r * D);
          f16_to_f32(D, row(sv, t0 + r), vb + (size_t)r * D);
        }
      };
      // Rows from each query's start: several starts run a query at a time (the same rows per
      // fetch as its own call, so the same sums).
      const float* qoh = &qo[(size_t)h * n_q * G * D];
      const int to = win ? sh.n_tokens : n_sink;
      auto from = [&](int s0) { return win ? std::max(q0 + nq_tok, s0) : std::min(s0, n_sink); };
      if (one_abs_start) {
        generic_task(sh, qoh, P.limits.data(), from(start), to, fetch, st);
      } else {
        Shape s1 = sh;
        s1.n_q = 1;
        for (int i = 0; i < n_q; ++i)
          generic_task(s1, qoh + (size_t)i * G * D, &P.limits[i], from(starts[i]), to, fetch,
                       States{st.base + (size_t)i * G * st.stride(), D});
      }
    }
  }

  // Merge: quantized chunks (V domain, K means already in their running maxima) -> inverse
  // transform -> V mean -> merge window and sinks -> normalize. Centred V: acc holds
  // sum_t w_t (v_t - mu_v), so add mu_v * l (per chunk when V has a mean per segment).
  std::vector<float> tmp(state_floats);
  const States acc{tmp.data(), D};
  for (int h = 0; h < KVH; ++h) {
    const Stream& sv = L.v[h];
    auto to_orig_mean = [&](const States& x, int k, int j) {  // row k of x, mean of stream index j
      sv.to_orig(-1, 1, x.acc(k));
      if (!sv.centre.on) return;
      const float* mu = sv.centre.mu_of(j);
      for (int d = 0; d < D; ++d) x.acc(k)[d] += mu[d] * x.l(k);
    };
    for (int k = 0; k < n_q * G; ++k) {
      const int i = k / G, g = k % G;
      acc.reset(0);
      // One V mean: merge in the V domain, then one inverse transform. A mean per chunk: each
      // chunk to the original domain, plus its V mean, then merge.
      for (int c = 0; c < n_chunks; ++c) {
        if (!chunk_runs(c)) continue;
        const States sc{&states[((size_t)h * tasks_per_head + c) * per_task], D};
        if (vseg > 0 && sc.m(k) != kNegInf) to_orig_mean(sc, k, c * chunk);
        merge_state(acc, 0, sc, k);
      }
      if (vseg == 0 && n_chunks > 0 && acc.m(0) != kNegInf) to_orig_mean(acc, 0, 0);
      if (n_win > 0)
        merge_state(acc, 0, States{&states[((size_t)h * tasks_per_head + task_win) * per_task], D}, k);
      if (n_sink > 0)
        merge_state(acc, 0, States{&states[((size_t)h * tasks_per_head + task_sink) * per_task], D}, k);
      float* o = out + ((size_t)i * sh.H + h * G + g) * D;
      if (acc.m(0) == kNegInf || acc.l(0) <= 0) {
        std::fill(o, o + D, 0.f);
      } else {
        const float inv = 1.0f / acc.l(0);
        for (int d = 0; d < D; ++d) o[d] = acc.acc(0)[d] * inv;
      }
    }
  }
}

}  // namespace kv

const char* attn_kernel_name(AttnKernel k) {
  static const char* const n[] = {"reference", "fused", "lut8"};
  return n[(int)k];
}

AttnKernel parse_attn_kernel(const std::string& name) {
  for (AttnKernel k : {AttnKernel::reference, AttnKernel::fused, AttnKernel::lut8})
    if (name == attn_kernel_name(k)) return k;
  TQ_CHECK(false, "unknown attention kernel '%s' (valid: reference, fused, lut8)", name.c_str());
  return AttnKernel::fused;
}

AttnKernel attn_kernel_from_env(AttnKernel fallback) {
  const char* e = std::getenv("TQ_ATTN");
  if (!e || !*e) return fallback;
  try {
    return parse_attn_kernel(e);
  } catch (const Error& err) {
    throw Error(std::string("TQ_ATTN: ") + err.what());
  }
}

void attention(const KvCache& cache, int layer, int n_q, const float* q, float* out,
               const AttentionParams& p) {
  if (p.kernel == AttnKernel::reference) return attention_ref(cache, layer, n_q, q, out, p);
  std::vector<float> q_pairs;  // the cache's pair order (KvCacheConfig::rope_neox)
  if (n_q > 0 && p.n_heads > 0) q = kv::in_pair_order(cache.impl(), q, (size_t)n_q * p.n_heads, q_pairs);
  const int W = p.sliding_window;
  TQ_CHECK(W >= 0, "attention: negative sliding window %d", W);
  if (W == 0 || n_q == 0) {
    kv::run_attention(cache, layer, n_q, q, out, p, nullptr);
    return;
  }
  // Sliding window: the queries whose window starts at 0 run together. Each later query starts
  // at pos - W + 1; those whose starts cut the same 32-token block (stream coordinates, after
  // the sinks; a start at the block's end counts with it) run together: the cut block from each
  // one's start, the blocks after it for all of them (each query's sums are those of its own
  // call with the float and f16 kernels). The groups run in parallel, each on one thread.
  TQ_CHECK(layer >= 0 && layer < cache.config().n_layers, "attention: layer %d out of range [0, %d)", layer,
           cache.config().n_layers);
  const int pos0 = p.pos0 >= 0 ? p.pos0 : cache.n_tokens(layer) - n_q;
  TQ_CHECK(pos0 >= 0, "attention: %d queries but layer %d holds %d tokens", n_q, layer, cache.n_tokens(layer));
  const int n_first = std::clamp(W - pos0, 0, n_q);  // queries at positions < W
  AttentionParams pi = p;
  if (n_first > 0) {
    pi.pos0 = pos0;
    kv::run_attention(cache, layer, n_first, q, out, pi, nullptr);
  }
  const size_t row = (size_t)p.n_heads * cache.config().head_dim;
  const int q0 = std::min(cache.n_tokens(layer), cache.config().sink);
  auto cut_block = [&](int i) {  // -1: the start is in the sinks
    const int j = pos0 + i - W + 1 - q0;
    return j <= 0 ? -1 : (j - 1) / kv::kBlock;
  };
  std::vector<int> group_at, starts(n_q);
  for (int i = n_first; i < n_q; ++i) {
    starts[i] = pos0 + i - W + 1;
    if (i == n_first || cut_block(i) != cut_block(i - 1)) group_at.push_back(i);
  }
  const int n_groups = (int)group_at.size();
  group_at.push_back(n_q);
  auto run_group = [&](int g, AttentionParams& pg) {
    const int i = group_at[g];
    pg.pos0 = pos0 + i;
    kv::run_attention(cache, layer, group_at[g + 1] - i, q + i * row, out + i * row, pg, &starts[i]);
  };
  if (n_groups <= 1) {  // none past W, or a decode step: one call (which may fork) or none
    if (n_groups == 1) run_group(0, pi);
    return;
  }
  const int n_threads = p.n_threads > 0 ? p.n_threads : omp_get_max_threads();
  pi.n_threads = 1;
  std::exception_ptr err;
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) firstprivate(pi) if (n_threads > 1)
  for (int g = 0; g < n_groups; ++g) {
    try {
      run_group(g, pi);
    } catch (...) {
#pragma omp critical(tq_attention_error)
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
}

std::string attention_kernel(const KvCache& cache, int layer, const AttentionParams& p) {
  using namespace kv;
  const auto& I = cache.impl();
  TQ_CHECK(layer >= 0 && layer < (int)I.layers.size(), "attention_kernel: layer %d out of range 0..%d", layer,
           (int)I.layers.size() - 1);
  Shape sh{};
  sh.D = I.cfg.head_dim;
  sh.KVH = I.cfg.n_kv_heads;
  TQ_CHECK(p.n_heads > 0 && p.n_heads % sh.KVH == 0, "attention_kernel: %d query heads over %d kv heads",
           p.n_heads, sh.KVH);
  sh.H = p.n_heads;
  sh.G = p.n_heads / sh.KVH;
  if (p.kernel == AttnKernel::reference) return "reference";
  const Layer& L = I.layers[layer];
  std::vector<std::string> kernels;  // the distinct kernels of the layer's KV heads, in head order
  for (int h = 0; h < sh.KVH; ++h) {
    const std::string n = kernel_name(pick_kernel(sh, L.k[h], L.v[h], p.kernel));
    if (std::find(kernels.begin(), kernels.end(), n) == kernels.end()) kernels.push_back(n);
  }
  std::string names = kernels[0];
  for (size_t i = 1; i < kernels.size(); ++i) names += "+" + kernels[i];
  return names;
}

void attention_ref(const KvCache& cache, int layer, int n_q, const float* q, float* out,
                   const AttentionParams& p) {
  using namespace kv;
  std::vector<float> q_pairs;  // the cache's pair order (KvCacheConfig::rope_neox)
  if (n_q > 0 && p.n_heads > 0) q = in_pair_order(cache.impl(), q, (size_t)n_q * p.n_heads, q_pairs);
  Prepared P = prepare(cache, layer, n_q, q, out, p);
  if (n_q == 0) return;
  const Shape& sh = P.sh;
  const auto& I = cache.impl();
  const Layer& L = I.layers[layer];
  const int D = sh.D, G = sh.G, W = I.cfg.window, S = I.cfg.sink;
  const int n_sink = std::min(sh.n_tokens, S), nq = sh.n_quant;
  std::vector<float> K((size_t)sh.n_tokens * D), V((size_t)sh.n_tokens * D);
  std::vector<double> s(sh.n_tokens), o(D);
  for (int h = 0; h < sh.KVH; ++h) {
    const Stream& sk = L.k[h];
    const Stream& sv = L.v[h];
    // Every row in the original domain: sinks, then mu + decoded blocks, then the window.
    for (int t = 0; t < n_sink; ++t) {
      fp16_to_fp32_n((size_t)D, sk.sink_rows.get() + (size_t)t * D, &K[(size_t)t * D]);
      fp16_to_fp32_n((size_t)D, sv.sink_rows.get() + (size_t)t * D, &V[(size_t)t * D]);
    }
    const int j0 = sk.n_dropped;  // sliding window: blocks before it are gone
    for (int i = 0; i < n_q && j0 > 0; ++i)
      TQ_CHECK(p.sliding_window > 0 && P.limits[i] - p.sliding_window >= n_sink + j0,
               "attention_ref: layer %d keeps tokens from position %d on; query %d needs earlier ones", layer,
               n_sink + j0, i);
    if (nq > j0) {
      float* Kq = &K[(size_t)n_sink * D];  // row j: stream index j
      float* Vq = &V[(size_t)n_sink * D];
      sk.decode_domain(j0, nq - j0, Kq + (size_t)j0 * D);
      sk.to_orig(j0, nq - j0, Kq + (size_t)j0 * D);
      sv.decode_domain(j0, nq - j0, Vq + (size_t)j0 * D);
      sv.to_orig(j0, nq - j0, Vq + (size_t)j0 * D);
    }
    for (int t = n_sink + nq; t < sh.n_tokens; ++t) {
      const int slot = (t - S) % W;
      fp16_to_fp32_n((size_t)D, sk.ring.get() + (size_t)slot * D, &K[(size_t)t * D]);
      fp16_to_fp32_n((size_t)D, sv.ring.get() + (size_t)slot * D, &V[(size_t)t * D]);
    }
    for (int i = 0; i < n_q; ++i) {
      const int lim = P.limits[i];
      const int t0 = p.sliding_window > 0 ? std::max(0, lim - p.sliding_window) : 0;
      for (int g = 0; g < G; ++g) {
        const float* qv = q + ((size_t)i * sh.H + h * G + g) * D;
        float* ov = out + ((size_t)i * sh.H + h * G + g) * D;
        if (lim == 0) { std::fill(ov, ov + D, 0.f); continue; }
        double mx = -std::numeric_limits<double>::infinity();
        for (int t = t0; t < lim; ++t) {
          double acc = 0;
          for (int d = 0; d < D; ++d) acc += (double)qv[d] * K[(size_t)t * D + d];
          s[t] = acc * sh.scale;
          mx = std::max(mx, s[t]);
        }
        double l = 0;
        std::fill(o.begin(), o.end(), 0.0);
        for (int t = t0; t < lim; ++t) {
          const double w = std::exp(s[t] - mx);
          l += w;
          for (int d = 0; d < D; ++d) o[d] += w * V[(size_t)t * D + d];
        }
        for (int d = 0; d < D; ++d) ov[d] = (float)(o[d] / l);
      }
    }
  }
}

}  // namespace tq
