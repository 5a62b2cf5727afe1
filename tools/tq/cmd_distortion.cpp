// tq distortion: measured MSE and inner-product error of a quantizer on random unit vectors.
#include <cmath>

#include "cli.h"
#include "tq/distortion.h"
#include "tq/error.h"
#include "tq/quantizer.h"

namespace {

void setup(CLI::App& app) {
  struct Opts {
    int dim = 128, bits = 4;
    size_t n = 10000;
    std::string rotation = "hadamard", quantizer = "mse", law = "beta", norm = "f16", data = "unit";
    uint64_t seed = 1;
    bool no_corr = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = tq::cli::subcommand(app, "distortion",
      "Quantize N random unit vectors and report mse = mean ||u - u_hat||^2, the inner-product error\n"
      "against queries at cosine 0.5 to each vector (ip_bias = mean(estimate - truth), ip_rmse) and\n"
      "bits_per_value including norm storage. The paper's bounds are printed beside the mse.");
  sub->add_option("--dim,-d", o->dim, "dimension (>= 2)")->capture_default_str();
  sub->add_option("--bits,-b", o->bits, "bits per coordinate, 1..8")->capture_default_str();
  sub->add_option("--n,-n", o->n, "number of vectors")->capture_default_str()->check(CLI::Range(size_t(1), size_t(1) << 26));
  sub->add_option("--rotation,-r", o->rotation, "haar | hadamard | block32 | block64 | block128 | givens | iso4 | identity")
      ->capture_default_str();
  sub->add_option("--quantizer,-q", o->quantizer, "mse | prod | qjl")->capture_default_str();
  sub->add_option("--law", o->law, "codebook law: beta | gauss")->capture_default_str();
  sub->add_option("--norm", o->norm, "norm storage: f16 | f32")->capture_default_str();
  sub->add_flag("--no-norm-correction", o->no_corr, "store ||x|| instead of ||x|| / ||c[idx]|| (mse only)");
  sub->add_option("--data", o->data, "unit: isotropic unit vectors; outlier: key-like vectors with 1/16 of the channels 10x larger")
      ->capture_default_str();
  sub->add_option("--seed,-s", o->seed, "seed for the data and the rotation (0 .. 2^64-1)")->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) { return !v.empty() && v[0] == '-' ? std::string("the seed must not be negative") : std::string(); },
          "UINT", "non-negative"));
  sub->add_flag("--json", o->json, "print one JSON object on stdout");
  sub->callback([o] {
    tq::QuantizerConfig cfg;
    cfg.dim = o->dim;
    cfg.bits = o->bits;
    cfg.rotation = tq::parse_rotation(o->rotation);
    cfg.seed = o->seed;
    cfg.law = tq::parse_law(o->law);
    cfg.norm = tq::parse_norm_format(o->norm);
    cfg.norm_correction = !o->no_corr;
    auto q = tq::make_quantizer(tq::parse_quantizer_kind(o->quantizer), cfg);
    const tq::DistortionResult r = tq::measure_distortion(*q, o->n, o->seed, o->data.c_str());
    const double upper = std::sqrt(3.0) * M_PI / 2 * std::pow(4.0, -o->bits);
    const double lower = std::pow(4.0, -o->bits);
    if (o->json) {
      tq::cli::print_json({{"dim", o->dim}, {"bits", o->bits}, {"n", o->n}, {"rotation", o->rotation},
                           {"quantizer", o->quantizer}, {"data", o->data}, {"law", o->law}, {"norm", o->norm},
                           {"norm_correction", cfg.norm_correction}, {"seed", o->seed}, {"mse", r.mse},
                           {"ip_bias", r.ip_bias}, {"ip_rmse", r.ip_rmse}, {"ip_slope", r.ip_slope},
                           {"bits_per_value", q->bits_per_value()}, {"paper_upper_bound", upper},
                           {"lower_bound", lower}});
      return;
    }
    std::printf("%s d=%d bits=%d rotation=%s n=%zu%s\n", o->quantizer.c_str(), o->dim, o->bits, o->rotation.c_str(),
                o->n, cfg.norm_correction || o->quantizer != "mse" ? "" : " (no norm correction)");
    std::printf("  mse            %.6f   (paper upper bound %.6f, lower bound %.6f)\n", r.mse, upper, lower);
    std::printf("  ip_bias        %+.6f\n  ip_rmse        %.6f\n  ip_slope       %.4f\n", r.ip_bias, r.ip_rmse,
                r.ip_slope);
    std::printf("  bits_per_value %.4f\n", q->bits_per_value());
  });
}

tq::cli::Registrar reg("distortion", setup);

}  // namespace
