// `tq calibrate`: fits a per-KV-head cache allocation to a model within a bit budget and
// writes it as a --kv-config file (include/tq/calibrate.h has the method).
#include <signal.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "llm_cli.h"
#include "tq/common.h"
#include "tq/calibrate.h"
#include "tq/fileio.h"

namespace {

volatile sig_atomic_t g_interrupted = 0;
void on_sigint(int) {
  g_interrupted = 1;
  signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

// The command line as given (from /proc/self/cmdline), "tq" first, quoted where needed.
std::string command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string out;
  bool first = true;
  for (size_t b = 0; b < all.size();) {
    size_t e = all.find('\0', b);
    if (e == std::string::npos) e = all.size();
    std::string a = first ? "tq" : all.substr(b, e - b);
    first = false;
    if (a.empty() || a.find_first_of(" \t'\"$;&|<>()*?#\\") != std::string::npos) {
      std::string q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      a = q + "'";
    }
    out += (out.empty() ? "" : " ") + a;
    b = e + 1;
  }
  return out;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  for (const auto& t : tq::cli::split_configs(s, ',')) out.push_back(t);
  return out;
}

nlohmann::json sens_json(const tq::CalibSensitivity& s, const std::string& model, const std::string& file) {
  nlohmann::json tk = nlohmann::json::array(), tv = nlohmann::json::array();
  for (size_t t = 0; t < s.k_types.size(); ++t) tk.push_back({{"type", s.k_types[t]}, {"kld", s.kld_k[t]}});
  for (size_t t = 0; t < s.v_types.size(); ++t) tv.push_back({{"type", s.v_types[t]}, {"kld", s.kld_v[t]}});
  return {{"format", "tq-calibrate-sensitivity-1"}, {"model", model}, {"file", file},
          {"n_layers", s.n_layers}, {"n_kv_heads", s.n_kv_heads}, {"head_dim", s.head_dim},
          {"ctx", s.n_ctx}, {"windows", s.windows}, {"windows_requested", s.windows_requested},
          {"scored_tokens", s.n_scored}, {"probe_k", s.probe_k}, {"probe_v", s.probe_v},
          {"protect", s.protect}, {"ppl_f16", s.ppl_ref}, {"seconds", s.seconds},
          {"sens_k", s.sens_k}, {"sens_v", s.sens_v}, {"types_k", tk}, {"types_v", tv}};
}

tq::CalibSensitivity read_sens(const std::string& path, std::string* file) {
  std::error_code ec;
  TQ_CHECK(!std::filesystem::is_directory(path, ec), "--sens '%s' is a directory", path.c_str());
  std::ifstream f(path, std::ios::binary);
  TQ_CHECK(f.good(), "cannot read --sens '%s'", path.c_str());
  tq::CalibSensitivity s;
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    TQ_CHECK(j.value("format", "") == "tq-calibrate-sensitivity-1", "not written by tq calibrate --save-sens");
    s.n_layers = j.at("n_layers");
    s.n_kv_heads = j.at("n_kv_heads");
    s.head_dim = j.at("head_dim");
    s.n_ctx = j.at("ctx");
    s.windows = j.at("windows");
    s.windows_requested = j.at("windows_requested");
    s.n_scored = j.at("scored_tokens");
    s.probe_k = j.at("probe_k");
    s.probe_v = j.at("probe_v");
    s.protect = j.at("protect");
    s.ppl_ref = j.at("ppl_f16");
    s.seconds = j.at("seconds");
    s.sens_k = j.at("sens_k").get<std::vector<double>>();
    s.sens_v = j.at("sens_v").get<std::vector<double>>();
    for (const auto& t : j.at("types_k")) {
      s.k_types.push_back(t.at("type"));
      s.kld_k.push_back(t.at("kld"));
    }
    for (const auto& t : j.at("types_v")) {
      s.v_types.push_back(t.at("type"));
      s.kld_v.push_back(t.at("kld"));
    }
    *file = j.value("file", "");
  } catch (const nlohmann::json::parse_error&) {
    TQ_CHECK(false, "--sens '%s' is not JSON (expected the file tq calibrate --save-sens writes)", path.c_str());
  } catch (const nlohmann::json::exception& e) {
    TQ_CHECK(false, "--sens '%s': %s", path.c_str(), e.what());
  } catch (const tq::Error& e) {
    TQ_CHECK(false, "--sens '%s': %s", path.c_str(), e.what());
  }
  const size_t n = static_cast<size_t>(s.n_layers) * s.n_kv_heads;
  TQ_CHECK(n > 0 && s.sens_k.size() == n && s.sens_v.size() == n && !s.k_types.empty() && !s.v_types.empty() &&
               s.n_scored > 0,
           "--sens '%s': %zu K and %zu V sensitivities for %zu KV heads, or no types", path.c_str(), s.sens_k.size(),
           s.sens_v.size(), n);
  for (const auto* v : {&s.sens_k, &s.sens_v, &s.kld_k, &s.kld_v})
    for (double x : *v) TQ_CHECK(std::isfinite(x) && x >= 0, "--sens '%s': a KLD that is not a number >= 0", path.c_str());
  return s;
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  const std::string text = j.dump(1) + "\n";
  tq::atomic_write_file(path, text.data(), text.size());
}

// Fails now, not after the measuring, when `path` cannot be created.
void check_writable(const std::string& path, const char* what) {
  std::error_code ec;
  TQ_CHECK(!std::filesystem::is_directory(path, ec), "%s '%s' is a directory", what, path.c_str());
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    TQ_CHECK(f.good(), "cannot write %s '%s'", what, path.c_str());
  }
  std::filesystem::remove(tmp, ec);
}

void setup(CLI::App& app) {
  auto* s = tq::cli::subcommand(
      app, "calibrate",
      "Fit a per-KV-head cache allocation to a model: on calibration text, the KLD each KV head's K and V\n"
      "add when quantized alone and what each candidate type costs the whole model, then the types that\n"
      "minimize the predicted KLD within --bits per value (everything counted: sinks, means, scales).\n"
      "Writes a --kv-config file. Use text that is not your evaluation text. Example:\n"
      "  tq calibrate -m models/gemma-3-270m-q4_k_m.gguf --bits 4.25 -f calib.txt -o gemma-kv4.25.kv");
  auto o = std::make_shared<tq::cli::ModelOpts>();
  auto file = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto bits = std::make_shared<double>(0);
  auto chunks = std::make_shared<int>(8);
  auto save_sens = std::make_shared<std::string>();
  auto sens = std::make_shared<std::string>();
  auto k_types = std::make_shared<std::string>();
  auto v_types = std::make_shared<std::string>();
  auto probe_k = std::make_shared<std::string>("tq2h5n8");
  auto probe_v = std::make_shared<std::string>("tq3n8");
  auto protect = std::make_shared<std::string>("ks");
  auto seed = std::make_shared<uint64_t>(0x5eed);
  tq::cli::add_model_opts(s, *o, 512);
  s->add_option("--bits", *bits, "bits per cached value, everything counted at -c tokens (e.g. 4.25)")->required();
  s->add_option("-o,--out", *out, "the --kv-config file to write")->required();
  s->add_option("-f,--file", *file, "calibration text (not your evaluation text)");
  s->add_option("--chunks", *chunks, "windows of -c tokens of calibration text (0 = all)")->capture_default_str();
  s->add_option("--save-sens", *save_sens, "also write the measured sensitivities (JSON) to this file");
  s->add_option("--sens", *sens, "sensitivities from --save-sens: skip the measuring (no -f needed)");
  s->add_option("--k-types", *k_types, "candidate K types, comma-separated (default: " +
                [] { std::string x; for (auto& t : tq::default_calib_k_types()) x += (x.empty() ? "" : ",") + t; return x; }() +
                ", those the model's head_dim supports)");
  s->add_option("--v-types", *v_types, "candidate V types (default: " +
                [] { std::string x; for (auto& t : tq::default_calib_v_types()) x += (x.empty() ? "" : ",") + t; return x; }() + ")");
  s->add_option("--probe-k", *probe_k, "the K type each head is probed with")->capture_default_str();
  s->add_option("--probe-v", *probe_v, "the V type each head is probed with")->capture_default_str();
  s->add_option("--protect", *protect,
                "protection tokens after the base K/V of the label (e.g. 'ks', 'plain ks', 's1 ck cs512 cr ks'); "
                "the probes use the same, spelled out")
      ->capture_default_str();
  s->add_option("--kv-seed", *seed, "seed of the cache rotations")->capture_default_str();
  s->callback([=] {
    const double c0 = tq::cpu_seconds();
    const auto w0 = std::chrono::steady_clock::now();
    TQ_CHECK(std::isfinite(*bits) && *bits > 0 && *bits < 16,
             "--bits %g out of range: bits per cached value, more than 0 and less than 16 (f16)", *bits);
    TQ_CHECK(o->ctx >= 16, "-c %d too small (>= 16)", o->ctx);
    TQ_CHECK(*chunks >= 0, "--chunks must be >= 0, got %d", *chunks);
    TQ_CHECK(!sens->empty() || !file->empty(),
             "no calibration text: give -f FILE (text that is not your evaluation text), or --sens FILE");
    TQ_CHECK(sens->empty() || (file->empty() && k_types->empty() && v_types->empty()),
             "--sens reuses measured sensitivities: -f, --k-types and --v-types do not apply with it");
    check_writable(*out, "output");
    if (!save_sens->empty()) check_writable(*save_sens, "--save-sens");
    std::string text_name = *file;
    tq::CalibSensitivity sv;
    std::string text;
    if (!sens->empty()) sv = read_sens(*sens, &text_name);
    else text = tq::read_text_file(*file);
    tq::calib_protection(*protect, *seed);  // a bad --protect fails before the model loads
    auto L = tq::cli::load_model(*o);
    const tq::LlamaConfig& mc = L->model.config();
    const std::string model = tq::cli::resolve_model(o->model);
    auto supported = [&](const std::vector<std::string>& list, bool given, const char* side) {
      std::vector<std::string> keep;
      for (const auto& t : list) {
        const tq::KvTypeTraits& f = tq::kv_type_traits(tq::parse_kv_type(t));
        if (f.supports(mc.head_dim)) keep.push_back(t);
        else TQ_CHECK(!given, "%s type %s does not support the model's head_dim %d", side, t.c_str(), mc.head_dim);
      }
      TQ_CHECK(!keep.empty(), "no candidate %s type supports the model's head_dim %d", side, mc.head_dim);
      return keep;
    };
    tq::CalibOptions co;
    co.n_ctx = o->ctx;
    co.n_chunks = *chunks;
    co.probe_k = *probe_k;
    co.probe_v = *probe_v;
    co.protect = *protect;
    co.seed = *seed;
    if (sens->empty()) {
      co.k_types = supported(k_types->empty() ? tq::default_calib_k_types() : split_list(*k_types), !k_types->empty(), "K");
      co.v_types = supported(v_types->empty() ? tq::default_calib_v_types() : split_list(*v_types), !v_types->empty(), "V");
      supported({co.probe_k}, true, "--probe-k");
      supported({co.probe_v}, true, "--probe-v");
      // The budget against the cheapest candidates before the long measuring.
      const double least = tq::calib_cheapest_bits(mc, co.k_types, co.v_types, co.protect, co.n_ctx, co.seed);
      TQ_CHECK(least <= *bits, "--bits %g is below the cheapest candidates: %.4f bits per value, everything counted at ctx %d",
               *bits, least, co.n_ctx);
      const std::vector<int32_t> tokens = L->tok.encode_with_bos(text);
      TQ_CHECK(tokens.size() >= static_cast<size_t>(co.n_ctx),
               "calibration text '%s' has %zu tokens, fewer than one window of %d (-c)", file->c_str(), tokens.size(),
               co.n_ctx);
      std::unique_ptr<tq::cli::Progress> pb;
      co.progress = [&](size_t d, size_t t) {
        if (!pb) pb = std::make_unique<tq::cli::Progress>("calibrate", t);
        pb->update(d);
      };
      co.stop = [] { return g_interrupted != 0; };
      g_interrupted = 0;
      struct sigaction sa = {}, old = {};
      sa.sa_handler = on_sigint;
      sigemptyset(&sa.sa_mask);
      sigaction(SIGINT, &sa, &old);
      try {
        sv = tq::calibrate_measure(L->model, tokens, co);
      } catch (...) {
        sigaction(SIGINT, &old, nullptr);
        throw;
      }
      sigaction(SIGINT, &old, nullptr);
      if (pb) pb->finish();
      if (!sv.complete()) {
        TQ_CHECK(sv.windows > 0, "interrupted before the first window was measured: nothing written");
        const std::string part = *out + ".partial", part_sens = *out + ".partial.sens.json";
        write_json_file(part_sens, sens_json(sv, model, text_name));
        const tq::CalibAllocation a = tq::calibrate_allocate(mc, sv, *bits, co.n_ctx, co.seed);
        tq::write_kv_config_file(part, {"PARTIAL: interrupted after " + std::to_string(sv.windows) + " of " +
                                            std::to_string(sv.windows_requested) + " calibration windows",
                                        "  " + command_line()},
                                 a.alloc.label);
        TQ_CHECK(false, "interrupted after %d of %d windows: the allocation from them is in %s, the sensitivities in %s "
                 "(finish with --sens %s)", sv.windows, sv.windows_requested, part.c_str(), part_sens.c_str(),
                 part_sens.c_str());
      }
    }
    if (!save_sens->empty()) write_json_file(*save_sens, sens_json(sv, model, text_name));
    const tq::CalibAllocation a = tq::calibrate_allocate(mc, sv, *bits, o->ctx, co.seed);
    char line[512];
    std::vector<std::string> comments;
    std::snprintf(line, sizeof line, "%s: %d layers x %d KV heads of %d dims; per-KV-head cache types at <= %g bits",
                  std::filesystem::path(model).filename().string().c_str(), mc.n_layers, mc.n_kv_heads, mc.head_dim,
                  *bits);
    comments.push_back(line);
    std::snprintf(line, sizeof line,
                  "per value, everything counted (%.4f at ctx %d: sinks, centring means, K scales included), fitted by",
                  a.bits_all, a.n_ctx);
    comments.push_back(line);
    std::snprintf(line, sizeof line, "`tq calibrate` on %s (%d window%s of %d tokens, %zu scored; f16 perplexity %.4f there).",
                  text_name.c_str(), sv.windows, sv.windows == 1 ? "" : "s", sv.n_ctx, sv.n_scored, sv.ppl_ref);
    comments.push_back(line);
    std::snprintf(line, sizeof line,
                  "Predicted KLD vs f16 %.6g (one-head sensitivities, probes K %s / V %s, x whole-model type KLDs).",
                  a.alloc.predicted_kld, sv.probe_k.c_str(), sv.probe_v.c_str());
    comments.push_back(line);
    comments.push_back("On another model its LAYER.HEAD entries are wrong or out of range: run tq calibrate for it.");
    comments.push_back("Written by:");
    comments.push_back("  " + command_line());
    tq::write_kv_config_file(*out, comments, a.alloc.label);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    const double cpu = tq::cpu_seconds() - c0;
    if (o->json) {
      nlohmann::json units = nlohmann::json::array();
      for (size_t u = 0; u < a.alloc.k_type.size(); ++u)
        units.push_back({{"layer", u / mc.n_kv_heads}, {"head", u % mc.n_kv_heads}, {"k", a.alloc.k_type[u]},
                         {"v", a.alloc.v_type[u]}, {"sens_k", sv.sens_k[u]}, {"sens_v", sv.sens_v[u]}});
      tq::cli::print_json({{"model", model}, {"file", text_name}, {"out", *out}, {"bits", *bits},
                           {"bits_per_value_all", a.bits_all}, {"kv_bytes_used", a.bytes_used}, {"ctx", a.n_ctx},
                           {"bits_cheapest", a.bits_cheapest}, {"windows", sv.windows}, {"scored_tokens", sv.n_scored},
                           {"ppl_f16", sv.ppl_ref}, {"predicted_kld", a.alloc.predicted_kld}, {"label", a.alloc.label},
                           {"seconds_measure", sens->empty() ? sv.seconds : 0.0}, {"seconds", wall},
                           {"cpu_seconds", cpu}, {"threads", L->model.threads()}, {"sens_from", *sens},
                           {"units", units}});
      return;
    }
    std::printf("%s: %s\n  %.4f bits per value everything counted at ctx %d (budget %g), predicted KLD %.5f\n"
                "  %.1f s (%.1f s CPU)\n",
                out->c_str(), tq::short_label(a.alloc.label, 72).c_str(), a.bits_all, a.n_ctx, *bits,
                a.alloc.predicted_kld, wall, cpu);
  });
}

tq::cli::Registrar reg("calibrate", setup);

}  // namespace
