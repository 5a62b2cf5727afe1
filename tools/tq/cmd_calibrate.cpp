// `tq calibrate`: fits a per-KV-head cache allocation to a model within a bit budget and
// writes it as a --kv-config file (include/tq/calibrate.h has the method).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

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

// What identifies the model a sensitivity file was measured on, saved in it as "model_id" (files
// of earlier builds have none): the architecture, the attention shape, the GGUF file's size and
// an XXH3 of every tensor's name, type, shape, size and first 4 KiB of data (about 4 KiB read per
// tensor, of a model loaded anyway). A renamed or moved file matches; a re-quantized, fine-tuned
// or other model does not.
struct ModelId {
  std::string arch;
  int n_layers = 0, n_kv_heads = 0, head_dim = 0;
  uint64_t file_bytes = 0;
  std::string tensors_xxh3;
  bool operator==(const ModelId&) const = default;
  std::string describe() const {
    return tq::strprintf("%s, %d layers x %d KV heads of %d dims, %llu bytes, tensors xxh3 %s", arch.c_str(), n_layers,
                         n_kv_heads, head_dim, static_cast<unsigned long long>(file_bytes), tensors_xxh3.c_str());
  }
  nlohmann::json json() const {
    return {{"arch", arch}, {"n_layers", n_layers}, {"n_kv_heads", n_kv_heads}, {"head_dim", head_dim},
            {"file_bytes", file_bytes}, {"tensors_xxh3", tensors_xxh3}};
  }
};

ModelId model_id(const tq::GgufFile& g, const tq::LlamaConfig& mc) {
  std::string buf;
  for (const tq::GgufTensor& t : g.tensors()) {
    buf += t.name;
    buf += tq::strprintf("|%d|", static_cast<int>(t.type));
    for (uint64_t n : t.ne) buf += std::to_string(n) + ",";
    buf += "|" + std::to_string(t.n_bytes) + "|";
    if (t.data) buf.append(reinterpret_cast<const char*>(t.data), std::min<size_t>(t.n_bytes, 4096));
  }
  ModelId id;
  id.arch = mc.arch;
  id.n_layers = mc.n_layers;
  id.n_kv_heads = mc.n_kv_heads;
  id.head_dim = mc.head_dim;
  std::error_code ec;
  id.file_bytes = std::filesystem::file_size(g.path(), ec);
  TQ_CHECK(!ec, "cannot stat the model '%s': %s", g.path().c_str(), ec.message().c_str());
  id.tensors_xxh3 = tq::strprintf("%016llx", static_cast<unsigned long long>(tq::checksum64(buf.data(), buf.size())));
  return id;
}

nlohmann::json sens_json(const tq::CalibSensitivity& s, const std::string& model, const ModelId& id,
                         const std::string& file) {
  nlohmann::json tk = nlohmann::json::array(), tv = nlohmann::json::array();
  for (size_t t = 0; t < s.k_types.size(); ++t) tk.push_back({{"type", s.k_types[t]}, {"kld", s.kld_k[t]}});
  for (size_t t = 0; t < s.v_types.size(); ++t) tv.push_back({{"type", s.v_types[t]}, {"kld", s.kld_v[t]}});
  return {{"format", "tq-calibrate-sensitivity-1"}, {"model", model}, {"model_id", id.json()}, {"file", file},
          {"n_layers", s.n_layers}, {"n_kv_heads", s.n_kv_heads}, {"head_dim", s.head_dim},
          {"ctx", s.n_ctx}, {"windows", s.windows}, {"windows_requested", s.windows_requested},
          {"scored_tokens", s.n_scored}, {"probe_k", s.probe_k}, {"probe_v", s.probe_v},
          {"protect", s.protect}, {"ppl_f16", s.ppl_ref}, {"seconds", s.seconds},
          {"sens_k", s.sens_k}, {"sens_v", s.sens_v}, {"types_k", tk}, {"types_v", tv},
          {"reused_layers", s.reused_layers}, {"reused_from_ctx", s.reused_from_ctx}};
}

// *id: the file's model_id, or none (std::nullopt) in files of earlier builds.
tq::CalibSensitivity read_sens(const std::string& path, std::string* file, std::string* model,
                               std::optional<ModelId>* id) {
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
    s.reused_layers = j.value("reused_layers", std::vector<int>{});  // absent in files of earlier releases
    s.reused_from_ctx = j.value("reused_from_ctx", 0);
    for (const auto& t : j.at("types_k")) {
      s.k_types.push_back(t.at("type"));
      s.kld_k.push_back(t.at("kld"));
    }
    for (const auto& t : j.at("types_v")) {
      s.v_types.push_back(t.at("type"));
      s.kld_v.push_back(t.at("kld"));
    }
    *file = j.value("file", "");
    *model = j.value("model", "");
    id->reset();
    if (j.contains("model_id")) {  // absent in files of earlier builds
      const nlohmann::json& m = j.at("model_id");
      ModelId x;
      x.arch = m.at("arch");
      x.n_layers = m.at("n_layers");
      x.n_kv_heads = m.at("n_kv_heads");
      x.head_dim = m.at("head_dim");
      x.file_bytes = m.at("file_bytes");
      x.tensors_xxh3 = m.at("tensors_xxh3");
      *id = x;
    }
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

// The allocation within `bits` from what was measured: calibrate_allocate for one context's
// sensitivities, calibrate_allocate_multi for several (every place that allocates asks here).
tq::CalibAllocation allocate(const tq::LlamaConfig& mc, const std::vector<tq::CalibSensitivity>& svs, double bits,
                             int n_ctx, uint64_t seed) {
  return svs.size() == 1 ? tq::calibrate_allocate(mc, svs[0], bits, n_ctx, seed)
                         : tq::calibrate_allocate_multi(mc, svs, bits, n_ctx, seed);
}

// "a,b,c": a default type list as --help shows it.
std::string comma_list(const std::vector<std::string>& items) {
  std::string x;
  for (const std::string& t : items) x += (x.empty() ? "" : ",") + t;
  return x;
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
  auto sens = std::make_shared<std::vector<std::string>>();
  auto long_ctx = std::make_shared<std::string>();
  auto long_chunks = std::make_shared<int>(1);
  auto long_probes = std::make_shared<std::string>("all");
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
  auto* chunks_opt = s->add_option("--chunks", *chunks, "windows of -c tokens of calibration text (0 = all)")->capture_default_str();
  s->add_option("--save-sens", *save_sens, "also write the measured sensitivities (JSON) to this file");
  s->add_option("--sens", *sens,
                "sensitivities from --save-sens: skip the measuring (no -f needed); several files (e.g. one at -c 512 "
                "and one at 2048) are fitted to together, as --long-ctx does. They must be of the -m model (checked by "
                "the model_id --save-sens records: architecture, shape, file size, tensor hash). With --long-ctx and -f: only the long "
                "contexts are measured (on the text the files were measured on, with their candidates, probes and "
                "protection), the first file's context must be -c, and --long-probes growing reuses its sensitivities");
  s->add_option("--long-ctx", *long_ctx,
                "also measure at these longer contexts (comma-separated, e.g. 2048) and fit one allocation to all: "
                "each context's predicted KLD relative to the cheapest types' there, summed, within --bits counted "
                "at every context as the cache holds it (sliding-window layers hold their window); for models whose "
                "global layers see more tokens at long context than at -c");
  s->add_option("--long-chunks", *long_chunks, "windows of calibration text at each --long-ctx")->capture_default_str();
  auto* long_probes_opt = s->add_option("--long-probes", *long_probes,
                "which layers get the one-head probes at each --long-ctx: all, or growing (only the layers that "
                "attend to more tokens there than at -c, e.g. a sliding-window model's global layers; the others "
                "keep their -c sensitivities, and the whole-model type costs are still measured at --long-ctx: on "
                "Gemma 3 at -c 512, 3 of 18 layers, 23 forward passes per window instead of 53)")
      ->capture_default_str();
  s->add_option("--k-types", *k_types, "candidate K types, comma-separated (default: " +
                comma_list(tq::default_calib_k_types()) +
                ", those the model's head_dim supports)");
  s->add_option("--v-types", *v_types, "candidate V types (default: " +
                comma_list(tq::default_calib_v_types()) + ")");
  auto* probe_k_opt = s->add_option("--probe-k", *probe_k, "the K type each head is probed with")->capture_default_str();
  auto* probe_v_opt = s->add_option("--probe-v", *probe_v, "the V type each head is probed with")->capture_default_str();
  auto* protect_opt = s->add_option("--protect", *protect,
                "protection tokens after the base K/V of the label (e.g. 'ks', 'plain ks', 's1 ck cs512 cr ks'); "
                "the probes use the same, spelled out. With --sens: the measured protection, to which only "
                "trellis codes ('ks tc') may be added (the same bytes; the label gets them, the sensitivities stay "
                "those of the codes measured)")
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
    TQ_CHECK(sens->empty() || (k_types->empty() && v_types->empty()),
             "--sens reuses measured sensitivities: --k-types and --v-types do not apply with it (the files' candidates are used)");
    TQ_CHECK(sens->empty() || long_ctx->empty() || !file->empty(),
             "--sens with --long-ctx measures the long contexts: give -f FILE, the calibration text the --sens files "
             "were measured on");
    TQ_CHECK(sens->empty() || !long_ctx->empty() || file->empty(),
             "--sens reuses measured sensitivities: -f applies with it only to measure --long-ctx");
    TQ_CHECK(sens->empty() || long_ctx->empty() || (probe_k_opt->count() == 0 && probe_v_opt->count() == 0),
             "--sens with --long-ctx measures with the files' probes: --probe-k and --probe-v do not apply");
    TQ_CHECK(sens->empty() || long_ctx->empty() || chunks_opt->count() == 0,
             "--sens with --long-ctx measures only at --long-ctx: --chunks does not apply (--long-chunks does)");
    TQ_CHECK(*long_chunks >= 1, "--long-chunks must be >= 1, got %d", *long_chunks);
    TQ_CHECK(*long_probes == "all" || *long_probes == "growing", "--long-probes '%s': all or growing",
             long_probes->c_str());
    TQ_CHECK(long_probes_opt->count() == 0 || !long_ctx->empty(),
             "--long-probes says which layers are probed at --long-ctx: give --long-ctx too");
    std::vector<int> longs;
    for (const auto& t : split_list(*long_ctx)) {
      int c = 0;
      size_t used = 0;
      try {
        c = std::stoi(t, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      TQ_CHECK(used == t.size() && used > 0, "--long-ctx '%s': not a context in tokens", t.c_str());
      TQ_CHECK(c > o->ctx, "--long-ctx %d must be more than -c %d", c, o->ctx);
      TQ_CHECK(std::find(longs.begin(), longs.end(), c) == longs.end(), "--long-ctx %d given twice", c);
      longs.push_back(c);
    }
    auto sens_path_at = [&](int c) {  // --save-sens for a --long-ctx context: NAME.cCTX.json
      const std::filesystem::path p(*save_sens);
      return (p.parent_path() / (p.stem().string() + ".c" + std::to_string(c) + p.extension().string())).string();
    };
    check_writable(*out, "output");
    if (!save_sens->empty()) {
      check_writable(*save_sens, "--save-sens");
      for (int c : longs) check_writable(sens_path_at(c), "--save-sens");
    }
    std::string text_name = *file;
    std::vector<tq::CalibSensitivity> svs;  // the -c measurement first, then each --long-ctx
    std::string text;
    std::vector<std::string> sens_texts, sens_models;
    std::vector<std::optional<ModelId>> sens_ids;
    for (const auto& p : *sens) {
      std::string name, mod;
      std::optional<ModelId> id;
      svs.push_back(read_sens(p, &name, &mod, &id));
      sens_texts.push_back(name);
      sens_models.push_back(mod);
      sens_ids.push_back(id);
      if (svs.size() == 1) text_name = name;
      else if (name != text_name) text_name += " + " + name;
    }
    const size_t n_loaded = svs.size();  // the --sens files; what is measured here follows them
    const bool measure = sens->empty() || !longs.empty();
    const bool extending = n_loaded > 0 && !longs.empty();  // measuring more contexts for saved ones
    if (extending) {
      // Measuring more contexts for saved sensitivities: one model, text, candidate set, probes and
      // protection, the first file at -c, and no context twice.
      const tq::CalibSensitivity& s0 = svs[0];
      for (size_t i = 0; i < n_loaded; ++i) {
        const tq::CalibSensitivity& x = svs[i];
        TQ_CHECK(x.n_layers == s0.n_layers && x.n_kv_heads == s0.n_kv_heads && x.head_dim == s0.head_dim &&
                     x.k_types == s0.k_types && x.v_types == s0.v_types && x.probe_k == s0.probe_k &&
                     x.probe_v == s0.probe_v && x.protect == s0.protect,
                 "--sens '%s' and '%s' were measured on other models or with other candidates, probes or protection",
                 (*sens)[0].c_str(), (*sens)[i].c_str());
        for (int c : longs)
          TQ_CHECK(c != x.n_ctx, "--long-ctx %d is already measured in --sens '%s'", c, (*sens)[i].c_str());
      }
      TQ_CHECK(s0.n_ctx == o->ctx, "-c %d: the first --sens '%s' was measured at ctx %d (give -c %d; the long contexts "
               "are fitted against it)", o->ctx, (*sens)[0].c_str(), s0.n_ctx, s0.n_ctx);
      const std::string fn = std::filesystem::path(*file).filename().string();
      for (size_t i = 0; i < n_loaded; ++i)
        TQ_CHECK(sens_texts[i].empty() || std::filesystem::path(sens_texts[i]).filename().string() == fn,
                 "-f '%s': --sens '%s' was measured on '%s'; measure the long contexts on the same text",
                 file->c_str(), (*sens)[i].c_str(), sens_texts[i].c_str());
      text_name = *file;
    }
    if (measure) text = tq::read_text_file(*file);
    tq::calib_protection(*protect, *seed);  // a bad --protect fails before the model loads
    auto L = tq::cli::load_model(*o);
    const tq::LlamaConfig& mc = L->model.config();
    const std::string model = tq::cli::resolve_model(o->model);
    const ModelId this_id = model_id(L->gguf, mc);
    // Saved sensitivities are of this model: by their model_id when they have one (always, also
    // when only allocating); files of earlier builds have none and keep the checks they had
    // (only when measuring more contexts for them: shape and model file name).
    const std::string mn = std::filesystem::path(model).filename().string();
    for (size_t i = 0; i < n_loaded; ++i) {
      if (extending)
        TQ_CHECK(svs[i].n_layers == mc.n_layers && svs[i].n_kv_heads == mc.n_kv_heads && svs[i].head_dim == mc.head_dim,
                 "--sens '%s' is of a model with %d layers x %d KV heads of %d dims, this one has %d x %d of %d",
                 (*sens)[i].c_str(), svs[i].n_layers, svs[i].n_kv_heads, svs[i].head_dim, mc.n_layers, mc.n_kv_heads,
                 mc.head_dim);
      if (sens_ids[i])
        TQ_CHECK(*sens_ids[i] == this_id, "--sens '%s' was measured on another model: '%s' (%s), not '%s' (%s)",
                 (*sens)[i].c_str(), sens_models[i].c_str(), sens_ids[i]->describe().c_str(), model.c_str(),
                 this_id.describe().c_str());
      else if (extending)
        TQ_CHECK(sens_models[i].empty() || std::filesystem::path(sens_models[i]).filename().string() == mn,
                 "--sens '%s' was measured on the model '%s', not '%s'", (*sens)[i].c_str(), sens_models[i].c_str(),
                 model.c_str());
    }
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
    if (extending) {  // the files' candidates, probes and protection
      co.k_types = svs[0].k_types;
      co.v_types = svs[0].v_types;
      co.probe_k = svs[0].probe_k;
      co.probe_v = svs[0].probe_v;
      co.protect = svs[0].protect;
    }
    if (measure) {
      if (n_loaded == 0) {
        co.k_types = supported(k_types->empty() ? tq::default_calib_k_types() : split_list(*k_types), !k_types->empty(), "K");
        co.v_types = supported(v_types->empty() ? tq::default_calib_v_types() : split_list(*v_types), !v_types->empty(), "V");
      } else {
        supported(co.k_types, true, "K");
        supported(co.v_types, true, "V");
      }
      supported({co.probe_k}, true, "--probe-k");
      supported({co.probe_v}, true, "--probe-v");
      // The budget against the cheapest candidates before the long measuring.
      const double least = tq::calib_cheapest_bits(mc, co.k_types, co.v_types, co.protect, co.n_ctx, co.seed);
      TQ_CHECK(least <= *bits, "--bits %g is below the cheapest candidates: %.4f bits per value, everything counted at ctx %d",
               *bits, least, co.n_ctx);
      for (int c : longs) {
        const double lb = tq::calib_cheapest_bits(mc, co.k_types, co.v_types, co.protect, c, co.seed);
        TQ_CHECK(lb <= *bits, "--bits %g is below the cheapest candidates: %.4f bits per value, everything counted "
                 "at ctx %d", *bits, lb, c);
      }
      const std::vector<int32_t> tokens = tq::cli::model_tokens(*L, text);
      const int max_ctx = longs.empty() ? co.n_ctx : *std::max_element(longs.begin(), longs.end());
      TQ_CHECK(tokens.size() >= static_cast<size_t>(max_ctx),
               "calibration text '%s' has %zu tokens, fewer than one window of %d (%s)", file->c_str(), tokens.size(),
               max_ctx, longs.empty() ? "-c" : "--long-ctx");
      std::unique_ptr<tq::cli::Progress> pb;  // one per measuring pass (ctx), made as it starts
      co.progress = [&](size_t d, size_t t) {
        if (pb) pb->update(d, t);
      };
      co.stop = [] { return g_interrupted != 0; };
      g_interrupted = 0;
      struct sigaction sa = {}, old = {};
      sa.sa_handler = on_sigint;
      sigemptyset(&sa.sa_mask);
      sigaction(SIGINT, &sa, &old);
      std::vector<int> ctxs;  // with --sens the -c measurement is svs[0], loaded
      if (n_loaded == 0) ctxs.push_back(co.n_ctx);
      ctxs.insert(ctxs.end(), longs.begin(), longs.end());
      bool stopped = false;
      std::string stop_at;  // where the interruption came: "ctx N (W of R windows)"
      for (size_t i = 0; i < ctxs.size() && !stopped; ++i) {
        tq::CalibOptions ci = co;
        ci.n_ctx = ctxs[i];
        const bool is_long = ctxs[i] != co.n_ctx;
        if (is_long) ci.n_chunks = *long_chunks;
        if (is_long && *long_probes == "growing") ci.probe_layers = tq::calib_layers_growing(mc, co.n_ctx, ctxs[i]);
        pb = std::make_unique<tq::cli::Progress>(!is_long ? "calibrate" : "calibrate c" + std::to_string(ctxs[i]));
        tq::CalibSensitivity one;
        try {
          one = tq::calibrate_measure(L->model, tokens, ci);
        } catch (...) {
          sigaction(SIGINT, &old, nullptr);
          throw;
        }
        pb->finish();
        stopped = !one.complete();
        if (stopped)
          stop_at = "ctx " + std::to_string(ctxs[i]) + " (" + std::to_string(one.windows) + " of " +
                    std::to_string(one.windows_requested) + " windows)";
        if (one.windows > 0 && ci.probe_layers) tq::calib_reuse_sens(one, svs[0], *ci.probe_layers);
        if (one.windows > 0) svs.push_back(std::move(one));
      }
      sigaction(SIGINT, &old, nullptr);
      if (stopped) {
        TQ_CHECK(!svs.empty(), "interrupted before the first window was measured: nothing written");
        const std::string part = *out + ".partial";
        std::string names;
        for (size_t i = 0; i < n_loaded; ++i) names += (names.empty() ? "" : " --sens ") + (*sens)[i];
        for (size_t i = n_loaded; i < svs.size(); ++i) {
          const std::string ps = *out + ".partial" + (i == 0 ? "" : ".c" + std::to_string(svs[i].n_ctx)) + ".sens.json";
          write_json_file(ps, sens_json(svs[i], model, this_id, text_name));
          names += (names.empty() ? "" : " --sens ") + ps;
        }
        const tq::CalibAllocation a = allocate(mc, svs, *bits, co.n_ctx, co.seed);
        tq::write_kv_config_file(part, {"PARTIAL: interrupted during the calibration at " + stop_at,
                                        "  " + command_line()},
                                 a.alloc.label);
        TQ_CHECK(false, "interrupted: the allocation from what was measured is in %s, the sensitivities in %s "
                 "(finish with --sens %s)", part.c_str(), names.c_str(), names.c_str());
      }
    }
    if (!save_sens->empty())
      for (size_t i = n_loaded; i < svs.size(); ++i)
        write_json_file(i == 0 ? *save_sens : sens_path_at(svs[i].n_ctx), sens_json(svs[i], model, this_id, text_name));
    // --protect with --sens: the measured protection, with trellis codes added at most.
    const std::string measured_protect = svs[0].protect;
    if (!sens->empty() && protect_opt->count() > 0 && *protect != measured_protect) {
      tq::KvSpec want = tq::calib_protection(*protect, *seed), had = tq::calib_protection(measured_protect, *seed);
      const bool adds_trellis = want.trellis && !had.trellis;
      want.trellis = had.trellis = false;
      TQ_CHECK(want == had && adds_trellis,
               "--protect '%s' with --sens: the sensitivities were measured with '%s'; only trellis codes ('%s tc') "
               "may be added to it", protect->c_str(), measured_protect.c_str(), measured_protect.c_str());
      for (auto& x : svs) x.protect = *protect;
    }
    const tq::CalibSensitivity& sv = svs[0];
    const tq::CalibAllocation a = allocate(mc, svs, *bits, o->ctx, co.seed);
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
    if (svs.size() == 1) {
      std::snprintf(line, sizeof line, "`tq calibrate` on %s (%d window%s of %d tokens, %zu scored; f16 perplexity %.4f there).",
                    text_name.c_str(), sv.windows, sv.windows == 1 ? "" : "s", sv.n_ctx, sv.n_scored, sv.ppl_ref);
      comments.push_back(line);
      std::snprintf(line, sizeof line,
                    "Predicted KLD vs f16 %.6g (one-head sensitivities, probes K %s / V %s, x whole-model type KLDs).",
                    a.alloc.predicted_kld, sv.probe_k.c_str(), sv.probe_v.c_str());
      comments.push_back(line);
    } else {
      std::snprintf(line, sizeof line, "`tq calibrate` on %s at %zu contexts together (the sum of each one's predicted KLD",
                    text_name.c_str(), svs.size());
      comments.push_back(line);
      comments.push_back("relative to the cheapest types' there, the budget kept at each, as the cache holds it):");
      for (size_t i = 0; i < svs.size(); ++i) {
        double bits_there = 0;
        for (size_t j = 0; j < a.check_ctx.size(); ++j)
          if (a.check_ctx[j] == svs[i].n_ctx) bits_there = a.check_bits[j];
        std::snprintf(line, sizeof line,
                      "  ctx %d: %d window%s, %zu scored, f16 perplexity %.4f; predicted KLD %.6g; %.4f bits per value",
                      svs[i].n_ctx, svs[i].windows, svs[i].windows == 1 ? "" : "s", svs[i].n_scored, svs[i].ppl_ref,
                      a.alloc.predicted_each[i], bits_there);
        comments.push_back(line);
        if (!svs[i].reused_layers.empty()) {
          std::string ls;
          for (int l : svs[i].reused_layers) ls += (ls.empty() ? "" : ",") + std::to_string(l);
          comments.push_back("    (one-head probes of layers " + ls + " not measured there: those of ctx " +
                             std::to_string(svs[i].reused_from_ctx) + ", --long-probes growing)");
        }
      }
      std::snprintf(line, sizeof line, "(one-head sensitivities, probes K %s / V %s, x whole-model type KLDs).",
                    sv.probe_k.c_str(), sv.probe_v.c_str());
      comments.push_back(line);
    }
    if (sv.protect != measured_protect) {
      std::snprintf(line, sizeof line,
                    "Written with protection '%s' (trellis codes: the same bytes); the sensitivities were measured "
                    "with '%s'.", sv.protect.c_str(), measured_protect.c_str());
      comments.push_back(line);
    }
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
      nlohmann::json contexts = nlohmann::json::array();
      double measure_s = 0;
      for (size_t i = 0; i < svs.size(); ++i) {
        if (i >= n_loaded) measure_s += svs[i].seconds;  // measured by this run
        nlohmann::json cj = {{"ctx", svs[i].n_ctx}, {"windows", svs[i].windows}, {"scored_tokens", svs[i].n_scored},
                             {"ppl_f16", svs[i].ppl_ref}, {"seconds_measure", svs[i].seconds},
                             {"reused_layers", svs[i].reused_layers}, {"reused_from_ctx", svs[i].reused_from_ctx}};
        if (!a.alloc.predicted_each.empty()) cj["predicted_kld"] = a.alloc.predicted_each[i];
        contexts.push_back(cj);
      }
      nlohmann::json checks = nlohmann::json::array();
      for (size_t j = 0; j < a.check_ctx.size(); ++j)
        checks.push_back({{"ctx", a.check_ctx[j]}, {"bits_per_value_all", a.check_bits[j]}});
      tq::cli::print_json({{"model", model}, {"file", text_name}, {"out", *out}, {"bits", *bits},
                           {"contexts", contexts}, {"budget_checks", checks},
                           {"bits_per_value_all", a.bits_all}, {"kv_bytes_used", a.bytes_used}, {"ctx", a.n_ctx},
                           {"bits_cheapest", a.bits_cheapest}, {"windows", sv.windows}, {"scored_tokens", sv.n_scored},
                           {"ppl_f16", sv.ppl_ref}, {"predicted_kld", a.alloc.predicted_each.empty() ? a.alloc.predicted_kld : a.alloc.predicted_each[0]},
                           {"objective", a.alloc.predicted_kld}, {"label", a.alloc.label},
                           {"seconds_measure", measure_s}, {"seconds", wall},
                           {"cpu_seconds", cpu}, {"threads", L->model.threads()}, {"sens_from", sens->empty() ? std::string() : (*sens)[0]}, {"sens_files", *sens},
                           {"units", units}});
      return;
    }
    std::string pred;
    char one[96];
    if (svs.size() == 1) {
      std::snprintf(one, sizeof one, "%.5f", a.alloc.predicted_kld);
      pred = one;
    } else {
      for (size_t i = 0; i < svs.size(); ++i) {
        std::snprintf(one, sizeof one, "%s%.5f at ctx %d", i ? ", " : "", a.alloc.predicted_each[i], svs[i].n_ctx);
        pred += one;
      }
      for (size_t j = 0; j < a.check_ctx.size(); ++j)
        if (a.check_ctx[j] != a.n_ctx) {
          std::snprintf(one, sizeof one, "; %.4f bits at ctx %d", a.check_bits[j], a.check_ctx[j]);
          pred += one;
        }
    }
    std::printf("%s: %s\n  %.4f bits per value everything counted at ctx %d (budget %g), predicted KLD %s\n"
                "  %.1f s (%.1f s CPU)\n",
                out->c_str(), tq::short_label(a.alloc.label, 72).c_str(), a.bits_all, a.n_ctx, *bits, pred.c_str(),
                wall, cpu);
  });
}

tq::cli::Registrar reg("calibrate", setup);

}  // namespace
