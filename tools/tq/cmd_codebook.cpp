// tq codebook: print a Lloyd-Max codebook with its boundaries and distortion.
#include <cmath>
#include <iostream>

#include "cli.h"
#include "tq/codebook.h"

namespace {

void setup(CLI::App& app) {
  struct Opts {
    int dim = 128, bits = 4;
    std::string law = "beta";
    bool json = false, scaled = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = tq::cli::subcommand(app, "codebook",
      "Print the Lloyd-Max codebook for the coordinates of a random unit vector in R^D after a random\n"
      "rotation: centroids, decision boundaries and the MSE per coordinate and per vector.");
  sub->add_option("--dim,-d", o->dim, "dimension D (>= 2)")->capture_default_str();
  sub->add_option("--bits,-b", o->bits, "bits per coordinate, 1..8")->capture_default_str();
  sub->add_option("--law", o->law, "coordinate law: beta (exact on the sphere) or gauss (N(0,1/D) limit)")
      ->capture_default_str();
  sub->add_flag("--scaled", o->scaled, "print values multiplied by sqrt(D) (units of the std deviation)");
  sub->add_flag("--json", o->json, "print one JSON object on stdout");
  sub->callback([o] {
    const tq::Codebook cb = tq::compute_codebook(o->dim, o->bits, tq::parse_law(o->law));
    const double k = o->scaled ? std::sqrt(static_cast<double>(o->dim)) : 1.0;
    std::vector<double> c, b;
    for (float v : cb.centroids) c.push_back(v * k);
    for (float v : cb.boundaries) b.push_back(v * k);
    if (o->json) {
      tq::cli::print_json({{"dim", cb.dim}, {"bits", cb.bits}, {"law", tq::law_name(cb.law)},
                           {"scaled", o->scaled}, {"centroids", c}, {"boundaries", b},
                           {"mse_per_coord", cb.mse_per_coord}, {"mse_per_vector", cb.mse_per_vector},
                           {"iterations", cb.iterations}});
      return;
    }
    std::printf("codebook d=%d bits=%d law=%s%s (%d Lloyd iterations)\n", cb.dim, cb.bits, tq::law_name(cb.law),
                o->scaled ? " (values x sqrt(d))" : "", cb.iterations);
    std::printf("%5s %14s %14s\n", "index", "centroid", "upper bound");
    for (int j = 0; j < cb.levels(); ++j) {
      if (j + 1 < cb.levels()) std::printf("%5d %14.8f %14.8f\n", j, c[j], b[j]);
      else std::printf("%5d %14.8f %14s\n", j, c[j], "inf");
    }
    std::printf("mse per coordinate %.6g, per unit vector %.6f\n", cb.mse_per_coord, cb.mse_per_vector);
  });
}

tq::cli::Registrar reg("codebook", setup);

}  // namespace
