// tq index build | search | eval: the compressed vector search index from the command line.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "tq/error.h"
#include "tq/fileio.h"
#include "tq/index.h"
#include "tq/simd.h"
#include "tq/vecs.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double cpu_s() {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

double peak_rss_mb() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

struct BuildOpts {
  double bits = 4;
  std::string metric = "cosine", codec = "mse", scale = "corrected", norm = "f16",
              rotation = "hadamard", law = "beta";
  uint64_t seed = 0x5eed;
  bool keep_vectors = false, fit_scale = false, center = false;
  int threads = 0;
};

void add_build_options(CLI::App* sub, BuildOpts& o) {
  sub->add_option("--bits,-b", o.bits, "bits per channel: 1..8 or a half-integer 1.5..7.5")->capture_default_str();
  sub->add_option("--metric,-m", o.metric, "ip | l2 | cosine")->capture_default_str();
  sub->add_option("--codec", o.codec, "mse (fast-scan scored) | prod (TurboQuant_prod, for comparison)")
      ->capture_default_str();
  sub->add_option("--scale", o.scale, "per-vector scale: plain | corrected | eden | lsq")->capture_default_str();
  sub->add_option("--norm", o.norm, "stored scale/norm format: f16 | f32")->capture_default_str();
  sub->add_option("--rotation", o.rotation, "haar | hadamard | block32 | block64 | block128 | givens | iso4 | identity")
      ->capture_default_str();
  sub->add_option("--law", o.law, "codebook law: beta | gauss")->capture_default_str();
  sub->add_option("--seed", o.seed, "rotation seed")->capture_default_str();
  sub->add_flag("--keep-vectors", o.keep_vectors, "also store the float vectors (for --rerank-full)");
  sub->add_flag("--fit-scale", o.fit_scale,
                "per-vector grid fit: try 9 grid scales 0.80..1.20 per vector, keep the codes with the\n"
                "best cosine to the vector (slower build, same bytes)");
  sub->add_flag("--center", o.center,
                "subtract the mean of the first added batch before quantizing (dim floats per index)");
  sub->add_option("--threads,-t", o.threads, "threads (0: OpenMP default)")->capture_default_str()
      ->check(CLI::Range(0, 1024));
}

tq::IndexConfig config_of(const BuildOpts& o, int dim) {
  tq::IndexConfig c;
  c.dim = dim;
  c.bits = o.bits;
  c.metric = tq::parse_metric(o.metric);
  c.codec = tq::parse_quantizer_kind(o.codec);
  TQ_CHECK(c.codec != tq::QuantizerKind::qjl, "index: codec must be mse or prod");
  c.scale = tq::parse_scale_mode(o.scale);
  c.norm = tq::parse_norm_format(o.norm);
  c.rotation = tq::parse_rotation(o.rotation);
  c.law = tq::parse_law(o.law);
  c.seed = o.seed;
  c.keep_vectors = o.keep_vectors;
  c.fit_scale = o.fit_scale;
  c.center = o.center;
  return c;
}

// Adds in batches (progress on stderr); returns wall seconds spent in add() and, in *cpu,
// the process CPU seconds (all threads) spent there.
double build_into(tq::Index& idx, const tq::FloatMatrix& x, int threads, double* cpu = nullptr) {
  if (threads > 0) omp_set_num_threads(threads);
  tq::cli::Progress prog("index add", x.n);
  const size_t batch = 1 << 16;
  double t = 0, c = 0;
  for (size_t i = 0; i < x.n; i += batch) {
    const size_t m = std::min(batch, x.n - i);
    const double t0 = now_s(), c0 = cpu_s();
    idx.add(m, x.row(i));
    t += now_s() - t0;
    c += cpu_s() - c0;
    prog.update(i + m);
  }
  prog.finish();
  if (cpu) *cpu = c;
  return t;
}

struct SearchOpts {
  int k = 10, rerank = -1, rerank_full = 0, threads = 0;
  bool no_fast_scan = false;
};
void add_search_options(CLI::App* sub, SearchOpts& o, bool with_k) {
  if (with_k) sub->add_option("-k", o.k, "results per query")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  sub->add_option("--rerank", o.rerank,
                  "fast-scan candidates re-scored with exact float LUTs (-1: auto = k + 16; 0: off)")
      ->capture_default_str();
  sub->add_option("--rerank-full", o.rerank_full, "candidates re-scored with kept float vectors (0: off)")
      ->capture_default_str();
  sub->add_flag("--no-fast-scan", o.no_fast_scan, "score with float LUTs instead of the uint8 SIMD scan");
}
tq::SearchParams params_of(const SearchOpts& o, int k, int threads) {
  tq::SearchParams p;
  p.k = k;
  p.rerank = o.rerank;
  p.rerank_full = o.rerank_full;
  p.fast_scan = !o.no_fast_scan;
  p.n_threads = threads;
  return p;
}

void setup(CLI::App& app) {
  auto* grp = tq::cli::group(app, "index",
      "Compressed nearest-neighbour index: TurboQuant codes scored directly with SIMD lookup tables");

  // ---- build
  {
    struct O {
      std::string input, output;
      size_t max_n = SIZE_MAX;
      bool json = false;
      BuildOpts b;
    };
    auto o = std::make_shared<O>();
    auto* sub = tq::cli::subcommand(*grp, "build",
        "Encode the vectors of --input (.fvecs, .bvecs or .npy) into an index file -o (written\n"
        "atomically: a crash mid-save leaves any previous file intact).\n"
        "Example: tq index build --input base.fvecs --bits 4 --metric cosine -o base.tqi");
    sub->add_option("--input,-i", o->input, "vectors to index")->required();
    sub->add_option("--output,-o", o->output, "index file to write")->required();
    sub->add_option("--max-n", o->max_n, "index only the first N vectors");
    add_build_options(sub, o->b);
    sub->add_flag("--json", o->json, "print one JSON object on stdout");
    sub->callback([o] {
      auto x = tq::read_vectors(o->input, o->max_n);
      tq::Index idx(config_of(o->b, static_cast<int>(x.d)));
      const double t = build_into(idx, x, o->b.threads);
      idx.save(o->output);
      const uint64_t fs = tq::file_size(o->output);
      if (o->json) {
        tq::cli::print_json({{"index", idx.describe()}, {"n", idx.size()}, {"dim", idx.dim()},
                             {"build_s", t}, {"bytes_per_vector", idx.code_bytes()},
                             {"file_bytes", fs}, {"output", o->output}});
      } else {
        std::printf("%s: %zu vectors, d=%d, %zu bytes/vector, built in %.3f s, %llu bytes -> %s\n",
                    idx.describe().c_str(), idx.size(), idx.dim(), idx.code_bytes(), t,
                    static_cast<unsigned long long>(fs), o->output.c_str());
      }
    });
  }

  // ---- search
  {
    struct O {
      std::string index, queries;
      size_t max_q = SIZE_MAX;
      bool json = false;
      SearchOpts s;
    };
    auto o = std::make_shared<O>();
    auto* sub = tq::cli::subcommand(*grp, "search",
        "Top-k search of every query in --queries against an index file; prints one line per\n"
        "query (id:score ...) or, with --json, {\"k\", \"ids\": [[...]], \"scores\": [[...]]}.\n"
        "Scores: similarity for ip/cosine (higher is nearer), squared distance for l2.\n"
        "Example: tq index search --index base.tqi --queries query.fvecs -k 10 --json");
    sub->add_option("--index", o->index, "index file (from tq index build)")->required();
    sub->add_option("--queries,-q", o->queries, "query vectors (.fvecs, .bvecs or .npy)")->required();
    sub->add_option("--max-queries", o->max_q, "use only the first N queries");
    sub->add_option("--threads,-t", o->s.threads, "threads (0: OpenMP default)")->check(CLI::Range(0, 1024));
    add_search_options(sub, o->s, true);
    sub->add_flag("--json", o->json, "print one JSON object on stdout");
    sub->callback([o] {
      auto idx = tq::Index::load(o->index);
      auto q = tq::read_vectors(o->queries, o->max_q);
      const size_t k = static_cast<size_t>(o->s.k);
      std::vector<float> s(q.n * k);
      std::vector<int64_t> ids(q.n * k);
      const double t0 = now_s();
      idx.search(q.n, q.d, q.data.data(), params_of(o->s, o->s.k, o->s.threads), s.data(), ids.data());
      const double t = now_s() - t0;
      if (o->json) {
        nlohmann::json jid = nlohmann::json::array(), js = nlohmann::json::array();
        for (size_t i = 0; i < q.n; ++i) {
          jid.push_back(std::vector<int64_t>(ids.begin() + i * k, ids.begin() + (i + 1) * k));
          nlohmann::json row = nlohmann::json::array();
          for (size_t j = 0; j < k; ++j) row.push_back(std::isfinite(s[i * k + j]) ? nlohmann::json(s[i * k + j]) : nlohmann::json());
          js.push_back(row);
        }
        tq::cli::print_json({{"index", idx.describe()}, {"k", k}, {"nq", q.n}, {"search_s", t},
                             {"ids", jid}, {"scores", js}});
        return;
      }
      for (size_t i = 0; i < q.n; ++i) {
        std::printf("%zu:", i);
        for (size_t j = 0; j < k; ++j) std::printf(" %lld:%.6g", static_cast<long long>(ids[i * k + j]), s[i * k + j]);
        std::printf("\n");
      }
      std::fprintf(stderr, "%zu queries in %.3f s (%.0f QPS)\n", q.n, t, q.n / t);
    });
  }

  // ---- eval
  {
    struct O {
      std::string base, queries, gt;
      size_t max_n = SIZE_MAX, max_q = SIZE_MAX;
      int k_max = 64, reps = 3;
      bool json = false;
      BuildOpts b;
      SearchOpts s;
    };
    auto o = std::make_shared<O>();
    auto* sub = tq::cli::subcommand(*grp, "eval",
        "Build an index of --base, search --queries and score against the ground truth --gt\n"
        "(.ivecs, exact neighbour ids per query, best first). Reports recall_1_at_k (share of\n"
        "queries whose true top-1 is among the first k returned, k = 1, 2, 4, ..., k-max),\n"
        "recall_10_at_10, build_s (median wall time of add(); build_cpu_s: CPU seconds of all\n"
        "threads), qps (median over --reps searches of all\n"
        "queries with k = k-max), bytes_per_vector (codes + norms, ids excluded) and memory.\n"
        "Example: tq index eval --base base.fvecs --queries q.fvecs --gt gt.ivecs --bits 4\n"
        "         --metric cosine --threads 2 --json");
    sub->add_option("--base", o->base, "database vectors")->required();
    sub->add_option("--queries,-q", o->queries, "query vectors")->required();
    sub->add_option("--gt", o->gt, "ground-truth neighbour ids (.ivecs)")->required();
    sub->add_option("--max-n", o->max_n, "use only the first N base vectors (the ground truth must match)");
    sub->add_option("--max-queries", o->max_q, "use only the first N queries");
    sub->add_option("--k-max", o->k_max, "largest k of recall_1_at_k (a power of two)")->capture_default_str()
        ->check(CLI::Range(1, 4096));
    sub->add_option("--reps", o->reps, "timed builds / searches (medians reported)")->capture_default_str()
        ->check(CLI::Range(1, 100));
    add_build_options(sub, o->b);
    add_search_options(sub, o->s, false);
    sub->add_flag("--json", o->json, "print one JSON object on stdout");
    sub->callback([o] {
      auto x = tq::read_vectors(o->base, o->max_n);
      auto q = tq::read_vectors(o->queries, o->max_q);
      auto gt = tq::read_ivecs(o->gt, q.n);
      TQ_CHECK(q.d == x.d, "eval: queries have d=%zu, base has d=%zu", q.d, x.d);
      TQ_CHECK(gt.n == q.n, "eval: ground truth has %zu rows for %zu queries", gt.n, q.n);
      for (size_t i = 0; i < gt.n; ++i)
        for (size_t j = 0; j < gt.d; ++j)
          TQ_CHECK(gt.row(i)[j] >= 0 && static_cast<size_t>(gt.row(i)[j]) < x.n,
                   "eval: ground truth row %zu has id %d outside the base [0, %zu)", i, gt.row(i)[j], x.n);
      const int threads = o->b.threads > 0 ? o->b.threads : omp_get_max_threads();
      const auto cfg = config_of(o->b, static_cast<int>(x.d));
      std::vector<double> builds, build_cpus;
      std::unique_ptr<tq::Index> idx;
      for (int r = 0; r < o->reps; ++r) {
        auto fresh = std::make_unique<tq::Index>(cfg);
        double c = 0;
        builds.push_back(build_into(*fresh, x, threads, &c));
        build_cpus.push_back(c);
        idx = std::move(fresh);
      }
      std::sort(builds.begin(), builds.end());
      std::sort(build_cpus.begin(), build_cpus.end());
      const int K = o->k_max;
      const size_t kk = static_cast<size_t>(K);
      std::vector<float> s(q.n * kk);
      std::vector<int64_t> ids(q.n * kk);
      const auto p = params_of(o->s, K, threads);
      std::vector<double> times;
      for (int r = 0; r < o->reps; ++r) {
        const double t0 = now_s();
        idx->search(q.n, q.d, q.data.data(), p, s.data(), ids.data());
        times.push_back(now_s() - t0);
      }
      std::sort(times.begin(), times.end());
      const double ts = times[times.size() / 2];
      nlohmann::json r1 = nlohmann::json::object();
      std::vector<std::pair<int, double>> r1v;
      for (int k = 1; k <= K; k *= 2) {
        size_t hit = 0;
        for (size_t i = 0; i < q.n; ++i)
          for (int j = 0; j < k; ++j)
            if (ids[i * kk + j] == gt.row(i)[0]) { ++hit; break; }
        const double v = static_cast<double>(hit) / q.n;
        r1[std::to_string(k)] = v;
        r1v.emplace_back(k, v);
      }
      double r10 = -1;
      if (gt.d >= 10 && K >= 10) {
        size_t hit = 0;
        for (size_t i = 0; i < q.n; ++i)
          for (int j = 0; j < 10; ++j)
            for (int t = 0; t < 10; ++t)
              if (ids[i * kk + j] == gt.row(i)[t]) { ++hit; break; }
        r10 = static_cast<double>(hit) / (10.0 * q.n);
      }
      const double bs = builds[builds.size() / 2];
      if (o->json) {
        tq::cli::print_json({{"index", idx->describe()}, {"n", x.n}, {"nq", q.n}, {"dim", x.d},
                             {"bits", o->b.bits}, {"metric", o->b.metric}, {"threads", threads},
                             {"simd", tq::simd::current_level()}, {"k_max", K},
                             {"recall_1_at_k", r1}, {"recall_10_at_10", r10 >= 0 ? nlohmann::json(r10) : nlohmann::json()},
                             {"build_s", bs}, {"build_cpu_s", build_cpus[build_cpus.size() / 2]},
                             {"qps", q.n / ts}, {"search_s", ts},
                             {"bytes_per_vector", idx->code_bytes()},
                             {"memory_bytes_per_vector", idx->memory_bytes_per_vector()},
                             {"peak_rss_mb", peak_rss_mb()}});
        return;
      }
      std::printf("%s  n=%zu nq=%zu d=%zu threads=%d simd=%s\n", idx->describe().c_str(), x.n, q.n, x.d, threads,
                  tq::simd::current_level().c_str());
      std::printf("  recall_1_at_k:");
      for (auto& [k, v] : r1v) std::printf(" @%d=%.4f", k, v);
      std::printf("\n  recall_10_at_10: %.4f\n  build_s: %.4f (cpu %.4f)\n  qps: %.0f\n  bytes_per_vector: %zu\n"
                  "  memory_bytes_per_vector: %.1f\n  peak_rss_mb: %.0f\n",
                  r10, bs, build_cpus[build_cpus.size() / 2], q.n / ts, idx->code_bytes(), idx->memory_bytes_per_vector(), peak_rss_mb());
    });
  }
}

tq::cli::Registrar reg("index", setup);

}  // namespace
