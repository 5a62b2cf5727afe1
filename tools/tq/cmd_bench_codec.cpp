// tq bench codec: encode / decode / query-vs-codes throughput of one quantizer.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "cli.h"
#include "tq/common.h"
#include "tq/distortion.h"
#include "tq/error.h"
#include "tq/quantizer.h"
#include "tq/simd.h"

namespace {

// Median over `reps` of the time for `fn` (which processes the whole batch).
template <class F>
double median_time(int reps, F&& fn) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    double t0 = tq::wall_seconds();
    fn();
    t.push_back(tq::wall_seconds() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void setup(CLI::App& app) {
  struct Opts {
    int dim = 128, bits = 4, threads = 1, reps = 5;
    size_t n = 100000;
    std::string rotation = "hadamard", quantizer = "mse";
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* bench = tq::cli::group(app, "bench", "Benchmarks that print figures (and JSON with --json)");
  auto* sub = tq::cli::subcommand(*bench, "codec",
      "Throughput of encode (quantize + pack), decode (unpack + inverse rotation) and scoring a\n"
      "rotated float query against packed codes, in vectors per second (median of --reps runs).");
  sub->add_option("--dim,-d", o->dim, "dimension")->capture_default_str();
  sub->add_option("--bits,-b", o->bits, "bits per coordinate, 1..8")->capture_default_str();
  sub->add_option("--n,-n", o->n, "vectors per run")->capture_default_str()->check(CLI::Range(size_t(1), size_t(1) << 24));
  sub->add_option("--rotation,-r", o->rotation, "haar | hadamard | block32 | block64 | block128 | givens | iso4")
      ->capture_default_str();
  sub->add_option("--quantizer,-q", o->quantizer, "mse | prod | qjl")->capture_default_str();
  sub->add_option("--threads,-t", o->threads, "threads (vectors split across threads)")->capture_default_str()
      ->check(CLI::Range(1, 1024));
  sub->add_option("--reps", o->reps, "timed runs (the median is reported)")->capture_default_str()->check(CLI::Range(1, 1000));
  sub->add_flag("--json", o->json, "print one JSON object on stdout");
  sub->callback([o] {
    tq::QuantizerConfig cfg;
    cfg.dim = o->dim;
    cfg.bits = o->bits;
    cfg.rotation = tq::parse_rotation(o->rotation);
    auto q = tq::make_quantizer(tq::parse_quantizer_kind(o->quantizer), cfg);
    const size_t n = o->n, d = static_cast<size_t>(o->dim);
    std::vector<float> x(tq::checked_mul(n, d, "benchmark data")), y(n * d);
    tq::random_unit_vectors(n, o->dim, 7, x.data());
    for (size_t i = 0; i < n * d; ++i) x[i] *= 3.0f;  // non-unit norms
    std::vector<uint8_t> codes(tq::checked_mul(n, q->code_bytes(), "benchmark codes"));
    std::vector<float> state(q->query_state_floats()), scores(n);
    q->prepare_query(x.data(), state.data());
    const int T = o->threads;
    auto split = [&](auto&& body) {
#pragma omp parallel for num_threads(T) schedule(static)
      for (int t = 0; t < T; ++t) {
        const size_t a = n * t / T, b = n * (t + 1) / T;
        if (b > a) body(a, b - a);
      }
    };
    q->encode(std::min<size_t>(n, 1024), x.data(), codes.data());  // warm-up (codebook, caches)
    const double te = median_time(o->reps, [&] {
      split([&](size_t a, size_t m) { q->encode(m, x.data() + a * d, codes.data() + a * q->code_bytes()); });
    });
    const double td = median_time(o->reps, [&] {
      split([&](size_t a, size_t m) { q->decode(m, codes.data() + a * q->code_bytes(), y.data() + a * d); });
    });
    const double ts = median_time(o->reps, [&] {
      split([&](size_t a, size_t m) { q->score(state.data(), m, codes.data() + a * q->code_bytes(), scores.data() + a); });
    });
    const std::string level = tq::simd::current_level();
    if (o->json) {
      tq::cli::print_json({{"dim", o->dim}, {"bits", o->bits}, {"rotation", o->rotation}, {"quantizer", o->quantizer},
                           {"threads", T}, {"n", n}, {"reps", o->reps}, {"simd", level},
                           {"code_bytes", q->code_bytes()}, {"encode_vectors_per_s", n / te},
                           {"decode_vectors_per_s", n / td}, {"score_codes_per_s", n / ts}});
      return;
    }
    std::printf("%s d=%d bits=%d rotation=%s threads=%d n=%zu simd=%s (median of %d)\n", o->quantizer.c_str(),
                o->dim, o->bits, o->rotation.c_str(), T, n, level.c_str(), o->reps);
    std::printf("  encode %12.0f vectors/s\n  decode %12.0f vectors/s\n  score  %12.0f codes/s\n", n / te, n / td,
                n / ts);
  });
}

tq::cli::Registrar reg("bench_codec", setup);

}  // namespace
