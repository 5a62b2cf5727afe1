#include <cerrno>
#include <cstdlib>
// tq bench attention: decode-attention speed, memory and accuracy per KV cache type, all
// types measured side by side in one run (steps interleaved across types).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <vector>

#include "cli.h"
#include "tq/common.h"
#include "tq/error.h"
#include "tq/kv_cache.h"
#include "tq/kv_spec.h"
#include "tq/simd.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> r;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) r.push_back(item);
  return r;
}

// Synthetic K/V: K ~ N(0,1) with a few large outlier channels (x8 on every 37th channel
// starting at 5, plus a per-head offset), V ~ N(0,1). Generated in batches, deterministically.
struct Gen {
  int kvh, D;
  uint64_t seed;
  void batch(int t0, int n, std::vector<float>& k, std::vector<float>& v) const {
    tq::Rng rng(seed * 1000003ull + (uint64_t)t0);
    k.resize((size_t)n * kvh * D);
    v.resize(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      const int d = (int)(i % D);
      k[i] = (float)rng.normal() * ((d % 37 == 5) ? 8.f : 1.f);
      v[i] = (float)rng.normal();
    }
  }
};

struct Row {
  std::string name, type_k, type_v;
  bool lut8 = false;     // this row's tq kernels use int8 tables ("tq4@lut8" or --lut8)
  bool protect = false;  // the automatic protection of a QK-norm model ("tq4@auto")
  bool trellis = false;  // trellis-coded tq parts ("tq4@tc" or --trellis)
  std::unique_ptr<tq::KvCache> cache;
  double append_s = 0;
  std::vector<std::vector<double>> ms;  // per thread setting
  std::vector<float> out;
  std::vector<float> out_err;  // outputs of the n_err queries (fused kernels, as timed)
  double append1_us = 0;  // median single-token append (decode-time write), one layer
  double rel_fused_ref = -1, rel_float_ref = -1;  // same codes: timed kernel / float kernel vs attention_ref
};

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

void setup(CLI::App& app) {
  struct Opts {
    int head_dim = 128, n_heads = 32, n_kv_heads = 8, context = 32768, steps = 9, window = 0, err_queries = 4;
    int queries = 1, sliding_window = 0;
    std::string kv = "f16,q8_0,q4_0,q4_0h,tq3,tq4", threads = "1";
    uint64_t seed = 1;
    bool json = false, exact = false, lut8 = false, trellis = false, grouped = false, no_ref = false;
  };
  auto o = std::make_shared<Opts>();
  auto* bench = tq::cli::group(app, "bench", "Benchmarks that print figures (and JSON with --json)");
  auto* sub = tq::cli::subcommand(*bench, "attention",
      "Decode attention (one query per head) over a KV cache filled with synthetic vectors (K: Gaussian\n"
      "with outlier channels, V: Gaussian), for each cache type side by side. Reports per type and\n"
      "thread count: ms_per_step (median over steps, steps interleaved across types),\n"
      "bytes_per_token (one layer, K+V, all kv heads), speedup_vs_f16 (same threads), max_abs_err and\n"
      "rel_err of the output vs exact f32 attention on the unquantized vectors, and the write\n"
      "throughput append_tokens_per_s (prefill batches of 1024 tokens, one layer, all kv heads).\n"
      "A type 'tq4:tq3' uses tq4 for K and tq3 for V (the cache spec k=tq4 v=tq3 plain); a suffix '@lut8' (e.g. 'tq4@lut8') runs that\n"
      "row's fused tq kernel with int8 lookup tables instead of float arithmetic, so both kernels\n"
      "can be timed side by side; a suffix '@tc' (e.g. 'tq3@tc', 'tq3@tc@lut8') stores trellis codes\n"
      "(KvCacheConfig::trellis) in that row's tq parts of 1-4 bits. fused~ref is the relative\n"
      "difference of the timed kernel's output from attention_ref (dequantize, then exact\n"
      "attention) on the same codes. With --queries N a step is one call with N queries at the\n"
      "last N positions, each seeing the tokens up to its own (a prefill micro-batch's attention\n"
      "for one layer); the error columns stay one-query decode at the full context. A suffix '@auto'\n"
      "(e.g. 'tq4h6n8:tq3h6n8@auto@lut8') gives that row the automatic protection as on a QK-norm\n"
      "model such as Gemma 3 (sink=1 center=k,rope,512 scale-k; RoPE base 1e6 over the whole head,\n"
      "scale-k fed the synthetic queries) instead of the bare types; '@autoN' the same with one K mean per N\n"
      "tokens (center=k,rope,N). --sliding-window W times the calls of a windowed layer (each query\n"
      "sees its last W tokens; past W, the queries whose windows start in the same 32-token block run\n"
      "as one group, the groups in parallel).");
  sub->add_option("--head-dim", o->head_dim, "head dimension D")->capture_default_str();
  sub->add_option("--n-heads", o->n_heads, "query heads")->capture_default_str();
  sub->add_option("--n-kv-heads", o->n_kv_heads, "kv heads (n-heads must be a multiple)")->capture_default_str();
  sub->add_option("--context", o->context, "cached tokens")->capture_default_str();
  sub->add_option("--kv", o->kv, "comma-separated cache types (K:V for different types)")->capture_default_str();
  sub->add_option("--threads", o->threads, "comma-separated thread counts, e.g. 1,2")->capture_default_str();
  sub->add_option("--steps", o->steps, "decode steps per type and thread count (median reported)")
      ->capture_default_str();
  sub->add_option("--queries", o->queries,
                  "queries per timed call, at the last positions with causal limits (1: decode; more: prefill)")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  sub->add_option("--window", o->window, "recent tokens kept in f16")->capture_default_str();
  sub->add_option("--sliding-window", o->sliding_window,
                  "timed calls and the same-codes check as a sliding-window layer's (AttentionParams::sliding_window; "
                  "0: none; the error columns vs exact stay full attention)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 24));
  sub->add_option("--seed", o->seed, "data seed")->capture_default_str();
  sub->add_option("--err-queries", o->err_queries, "queries averaged in rel_err / max_abs_err vs exact")
      ->capture_default_str()->check(CLI::Range(1, 64));
  sub->add_flag("--lut8", o->lut8, "every tq row uses the int8 lookup-table kernel (AVX-512 VNNI/VBMI/VBMI2)");
  sub->add_flag("--exact", o->exact, "never the int8 lookup-table kernel (overrides --lut8 and '@lut8')");
  sub->add_flag("--trellis", o->trellis, "every row stores trellis codes in its tq parts of 1-4 bits (as '@tc')");
  sub->add_flag("--no-ref", o->no_ref,
                "skip the same-codes check (timed and float-kernel output vs attention_ref on the cache)");
  sub->add_flag("--grouped", o->grouped,
                "run all steps of one type back to back (warm caches) instead of interleaving types");
  sub->add_flag("--json", o->json, "print one JSON object on stdout");
  sub->callback([o] {
    // Same OpenMP setting as the model commands: idle workers sleep instead of spinning (on the
    // shared 2-core machine spinning made 2-thread steps stall 4-20 ms at the barrier).
    TQ_CHECK(o->context >= 1, "--context must be >= 1");
    TQ_CHECK(o->queries <= o->context, "--queries %d is more than --context %d", o->queries, o->context);
    TQ_CHECK(o->steps >= 1, "--steps must be >= 1");
    TQ_CHECK(o->n_kv_heads >= 1 && o->n_heads % o->n_kv_heads == 0,
             "--n-heads %d must be a multiple of --n-kv-heads %d", o->n_heads, o->n_kv_heads);
    const int D = o->head_dim, KVH = o->n_kv_heads, H = o->n_heads, N = o->context;
    std::vector<int> threads;
    for (const auto& t : split_list(o->threads)) {
      char* end = nullptr;
      errno = 0;
      const long v = std::strtol(t.c_str(), &end, 10);
      TQ_CHECK(!t.empty() && end && *end == '\0' && errno == 0 && v >= 1 && v <= 1024,
               "--threads: '%s' is not a thread count in 1..1024", t.c_str());
      threads.push_back(static_cast<int>(v));
    }
    TQ_CHECK(!threads.empty(), "--threads is empty");
    const Gen gen{KVH, D, o->seed};
    const int kBatch = 1024;
    const int kAppend1 = 33;  // single-token appends timed after the decode steps

    // Queries (query 0 is timed; all n_err are used for the error vs exact) and the exact
    // f32 answers on the unquantized vectors (double accumulation).
    const int n_err = o->err_queries;
    const int G = H / KVH;
    const double scale = 1.0 / std::sqrt((double)D);
    std::vector<float> qs((size_t)n_err * H * D);
    {
      tq::Rng rng(o->seed ^ 0xabcdefull);
      for (auto& x : qs) x = (float)rng.normal();
    }
    // The timed call's queries (--queries): query 0 of qs, then queries from a second generator.
    const int NQ = o->queries;
    std::vector<float> qt((size_t)NQ * H * D);
    {
      tq::Rng rng(o->seed ^ 0x5eedull);
      for (auto& x : qt) x = (float)rng.normal();
      std::copy(qs.begin(), qs.begin() + (size_t)H * D, qt.begin());
    }
    const int HQ = n_err * H;
    std::vector<double> m(HQ, -INFINITY), l(HQ, 0), acc((size_t)HQ * D, 0);
    std::vector<float> kb, vb, qobs;
    for (int t0 = 0; t0 < N; t0 += kBatch) {
      const int n = std::min(kBatch, N - t0);
      gen.batch(t0, n, kb, vb);
      for (int hq = 0; hq < HQ; ++hq) {
        const int kh = (hq % H) / G;
        const float* qv = &qs[(size_t)hq * D];
        double* ac = &acc[(size_t)hq * D];
        for (int t = 0; t < n; ++t) {
          const float* kr = &kb[((size_t)t * KVH + kh) * D];
          const float* vr = &vb[((size_t)t * KVH + kh) * D];
          double s = 0;
          for (int d = 0; d < D; ++d) s += (double)qv[d] * kr[d];
          s *= scale;
          if (s > m[hq]) {
            const double a = std::exp(m[hq] - s);
            l[hq] *= a;
            for (int d = 0; d < D; ++d) ac[d] *= a;
            m[hq] = s;
          }
          const double w = std::exp(s - m[hq]);
          l[hq] += w;
          for (int d = 0; d < D; ++d) ac[d] += w * vr[d];
        }
      }
    }
    std::vector<float> exact((size_t)HQ * D);
    for (int hq = 0; hq < HQ; ++hq)
      for (int d = 0; d < D; ++d) exact[(size_t)hq * D + d] = (float)(acc[(size_t)hq * D + d] / l[hq]);

    // Fill one cache per type (timing only the appends).
    std::vector<Row> rows;
    const auto types = split_list(o->kv);
    TQ_CHECK(!types.empty(), "--kv is empty");
    tq::cli::Progress prog("fill", types.size() * (size_t)N);
    size_t done = 0;
    for (const auto& t : types) {
      Row r;
      r.name = t;
      // The row's cache as a KvSpec: 'K:V' and '@tc' are its k=/v= and trellis tokens; no sink or
      // centring (plain: the synthetic keys have no RoPE), the --window / --trellis flags on top.
      std::string spec = t, tokens;
      int segment = 512;
      bool segment_given = false;  // @autoN
      for (auto at = spec.rfind('@'); at != std::string::npos; at = spec.rfind('@')) {
        const std::string suffix = spec.substr(at + 1);
        // @autoN: the automatic protection with one K mean per N tokens instead of 512.
        const bool is_auto = suffix.rfind("auto", 0) == 0 && suffix.size() <= 9 &&
                             std::all_of(suffix.begin() + 4, suffix.end(), [](char c) { return c >= '0' && c <= '9'; });
        TQ_CHECK(suffix == "lut8" || suffix == "tc" || is_auto,
                 "--kv: unknown suffix '@%s' in '%s' (valid: @lut8, @tc, @auto, @autoN)", suffix.c_str(), t.c_str());
        if (suffix == "lut8") r.lut8 = true;
        else if (is_auto) {
          r.protect = true;
          if (suffix.size() > 4) {
            segment = std::stoi(suffix.substr(4));
            segment_given = true;
          }
        } else tokens += " trellis";
        spec = spec.substr(0, at);
      }
      r.lut8 = (r.lut8 || o->lut8) && !o->exact;
      const auto colon = spec.find(':');
      tokens = "k=" + spec.substr(0, colon) + " v=" + (colon == std::string::npos ? spec : spec.substr(colon + 1)) +
               (r.protect ? " sink=1 center=k,rope," + std::to_string(segment) + " scale-k" : std::string(" plain")) + tokens + (o->trellis ? " trellis" : "") +
               " window=" + std::to_string(o->window);
      // The row's spec and cache: an error names the --kv entry (and what @autoN sets).
      tq::KvSpec ks;
      tq::KvCacheConfig cfg;
      try {
        ks = tq::KvSpec::parse(tokens);
        tq::KvCacheConfig shape;
        shape.n_layers = 1;
        shape.n_kv_heads = KVH;
        shape.head_dim = D;
        shape.max_tokens = N + kAppend1;
        shape.rope_base = 1e6f;  // Gemma 3's global layers; read by the RoPE-rotating K mean only
        shape.rope_dim = D;
        cfg = ks.resolve(shape);
        r.cache = std::make_unique<tq::KvCache>(cfg);
      } catch (const tq::Error& e) {
        TQ_CHECK(false, "--kv '%s': %s%s", t.c_str(), e.what(),
                 segment_given ? " (@autoN: one K mean per N tokens)" : "");
      }
      r.type_k = tq::kv_format_name(ks.k);
      r.type_v = tq::kv_format_name(ks.v);
      r.trellis = ks.trellis;
      for (int t0 = 0; t0 < N; t0 += kBatch) {
        const int n = std::min(kBatch, N - t0);
        gen.batch(t0, n, kb, vb);
        if (r.protect) {  // scale-k chooses from the queries it sees: synthetic ones, untimed
          tq::Rng qr(o->seed * 7919ull + (uint64_t)t0);
          qobs.resize((size_t)n * H * D);
          for (auto& x : qobs) x = (float)qr.normal();
          r.cache->observe_queries(0, n, qobs.data(), H);
        }
        const auto a = Clock::now();
        r.cache->append(0, n, kb.data(), vb.data());
        r.append_s += std::chrono::duration<double>(Clock::now() - a).count();
        done += n;
        prog.update(done);
      }
      r.ms.resize(threads.size());
      r.out.resize((size_t)NQ * H * D);
      rows.push_back(std::move(r));
    }
    prog.finish();

    // Decode steps, interleaved across types.
    tq::AttentionParams p;
    p.n_heads = H;
    p.pos0 = N - NQ;  // the timed queries see N - NQ + 1 .. N tokens
    p.sliding_window = o->sliding_window;
    auto params = [&](const Row& r) {
      tq::AttentionParams pr = p;
      pr.kernel = r.lut8 ? tq::AttnKernel::lut8 : tq::AttnKernel::fused;
      return pr;
    };
    for (size_t ti = 0; ti < threads.size(); ++ti) {
      p.n_threads = threads[ti];
      for (auto& r : rows) tq::attention(*r.cache, 0, NQ, qt.data(), r.out.data(), params(r));  // warm up
      auto step = [&](Row& r) {
        const tq::AttentionParams pr = params(r);
        const auto a = Clock::now();
        tq::attention(*r.cache, 0, NQ, qt.data(), r.out.data(), pr);
        r.ms[ti].push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
      };
      if (o->grouped) {
        for (auto& r : rows)
          for (int s = 0; s < o->steps; ++s) step(r);
      } else {
        for (int s = 0; s < o->steps; ++s)
          for (auto& r : rows) step(r);
      }
    }
    // Outputs of all error queries (fused kernels as timed).
    for (auto& r : rows) {
      r.out_err.resize((size_t)HQ * D);
      tq::AttentionParams pe = params(r);
      pe.n_threads = threads.back();
      pe.pos0 = -1;  // one query at the full context
      pe.sliding_window = 0;
      for (int e = 0; e < n_err; ++e)
        tq::attention(*r.cache, 0, 1, &qs[(size_t)e * H * D], &r.out_err[(size_t)e * H * D], pe);
    }
    // Same codes: the timed call (all its queries) and the float kernel vs the
    // dequantize-then-exact oracle.
    if (!o->no_ref) {
      std::vector<float> ref((size_t)NQ * H * D), ex((size_t)NQ * H * D);
      for (auto& r : rows) {
        tq::AttentionParams pr = params(r);
        pr.n_threads = threads.back();
        tq::attention_ref(*r.cache, 0, NQ, qt.data(), ref.data(), pr);
        r.rel_fused_ref = rel_diff(r.out, ref);
        pr.kernel = tq::AttnKernel::fused;
        tq::attention(*r.cache, 0, NQ, qt.data(), ex.data(), pr);
        r.rel_float_ref = rel_diff(ex, ref);
      }
    }
    // Decode-time writes: single tokens (quantize on write), after the steps.
    {
      std::vector<float> k1, v1;
      gen.batch(N, kAppend1, k1, v1);
      for (auto& r : rows) {
        std::vector<double> us;
        for (int i = 0; i < kAppend1; ++i) {
          const auto a = Clock::now();
          r.cache->append(0, 1, k1.data() + (size_t)i * KVH * D, v1.data() + (size_t)i * KVH * D);
          us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
        }
        std::sort(us.begin(), us.end());
        r.append1_us = us[us.size() / 2];
      }
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      const size_t n = v.size();
      return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    };
    nlohmann::json results = nlohmann::json::array();
    for (size_t ti = 0; ti < threads.size(); ++ti) {
      double f16_ms = 0;
      for (auto& r : rows)
        if (r.name == "f16") f16_ms = median(r.ms[ti]);
      for (auto& r : rows) {
        double num = 0, den = 0, mx = 0;
        for (size_t i = 0; i < exact.size(); ++i) {
          const double e = (double)r.out_err[i] - exact[i];
          num += e * e;
          den += (double)exact[i] * exact[i];
          mx = std::max(mx, std::fabs(e));
        }
        const double ms = median(r.ms[ti]);
        nlohmann::json j;
        j["kv"] = r.name;
        j["type_k"] = r.type_k;
        j["type_v"] = r.type_v;
        j["trellis"] = r.trellis;
        j["protection"] = r.protect ? "sink=1 center=k,rope,512 scale-k" : "plain";
        j["kernel"] = tq::attention_kernel(*r.cache, 0, params(r));
        j["threads"] = threads[ti];
        j["ms_per_step"] = ms;
        j["ms_min"] = *std::min_element(r.ms[ti].begin(), r.ms[ti].end());
        j["bytes_per_token"] = r.cache->bytes_per_token();
        j["k_bytes_per_head"] = tq::kv_type_bytes(tq::parse_kv_type(r.type_k), D);
        j["v_bytes_per_head"] = tq::kv_type_bytes(tq::parse_kv_type(r.type_v), D);
        if (f16_ms > 0) j["speedup_vs_f16"] = f16_ms / ms; else j["speedup_vs_f16"] = nullptr;
        j["max_abs_err"] = mx;
        j["rel_err"] = std::sqrt(num / den);
        if (r.rel_fused_ref >= 0) {
          j["rel_err_fused_vs_ref"] = r.rel_fused_ref;
          j["rel_err_float_vs_ref"] = r.rel_float_ref;
        }
        j["append_tokens_per_s"] = N / r.append_s;
        j["append_us_per_token"] = r.append1_us;
        if (f16_ms > 0) j["append_pct_of_f16_step"] = 100.0 * r.append1_us / (1000.0 * f16_ms);
        results.push_back(j);
      }
    }
    if (o->json) {
      tq::cli::print_json({{"head_dim", D}, {"n_heads", H}, {"n_kv_heads", KVH}, {"context", N},
                           {"steps", o->steps}, {"queries", NQ}, {"window", o->window},
                           {"sliding_window", o->sliding_window}, {"exact", o->exact}, {"lut8", o->lut8}, {"trellis", o->trellis}, {"err_queries", n_err},
                           {"interleaved", !o->grouped},
                           {"simd", tq::simd::current_level()}, {"results", results}});
      return;
    }
    std::printf("%s attention: D=%d heads=%d kv_heads=%d context=%d queries=%d steps=%d window=%d sliding_window=%d simd=%s%s%s\n",
                NQ > 1 ? "prefill" : "decode", D, H, KVH, N, NQ, o->steps, o->window, o->sliding_window,
                tq::simd::current_level().c_str(), o->exact ? " exact" : "",
                o->grouped ? " grouped" : " interleaved");
    std::printf("%-12s %3s %10s %8s %10s %10s %10s %12s %10s %10s %10s\n", "kv", "thr", "ms/step", "vs f16", "B/token",
                "rel_err", "max_abs", "append tok/s", "append1 us", "fused~ref", "float~ref");
    for (const auto& j : results) {
      const std::string sp = j["speedup_vs_f16"].is_null() ? "-" : tq::strprintf("%.2fx", j["speedup_vs_f16"].get<double>());
      const double fr = j.contains("rel_err_fused_vs_ref") ? j["rel_err_fused_vs_ref"].get<double>() : -1;
      const double er = j.contains("rel_err_float_vs_ref") ? j["rel_err_float_vs_ref"].get<double>() : -1;
      const std::string frs = fr < 0 ? "-" : tq::strprintf("%.2e", fr), ers = er < 0 ? "-" : tq::strprintf("%.2e", er);
      std::printf("%-12s %3d %10.3f %8s %10.0f %10.2e %10.2e %12.0f %10.1f %10s %10s\n", j["kv"].get<std::string>().c_str(),
                  j["threads"].get<int>(), j["ms_per_step"].get<double>(), sp.c_str(),
                  j["bytes_per_token"].get<double>(), j["rel_err"].get<double>(), j["max_abs_err"].get<double>(),
                  j["append_tokens_per_s"].get<double>(), j["append_us_per_token"].get<double>(), frs.c_str(),
                  ers.c_str());
    }
  });
}

tq::cli::Registrar reg("bench_attention", setup);

}  // namespace
