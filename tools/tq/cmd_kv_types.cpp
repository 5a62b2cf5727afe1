// tq kv-types: the KV cache formats, one row of the traits table (include/tq/kv_cache.h) each.
#include <string>

#include "cli.h"
#include "tq/error.h"
#include "tq/kv_cache.h"

namespace {

std::string parts_text(const tq::KvTypeTraits& f) {
  std::string s;
  for (int p = 0; p < f.n_parts; ++p) {
    const tq::KvPart& q = f.parts[p];
    if (p) s += " + ";
    s += (q.quarters == 4 ? std::string("D") : q.quarters == 1 ? "D/4" : std::to_string(q.quarters) + "D/4") +
         " x " + std::to_string(q.bits) + "b";
    if (q.norm != tq::KvNorm::none) s += std::string(" ") + tq::kv_norm_name(q.norm);
  }
  return s;
}

std::string kernels_text(uint8_t m) {
  std::string s;
  const std::pair<uint8_t, const char*> names[] = {{tq::kKvKernelF16, "f16"},
                                                   {tq::kKvKernelTqFloat, "tq-float"},
                                                   {tq::kKvKernelTqLut8, "tq-lut8"},
                                                   {tq::kKvKernelRows, "rows"}};
  for (const auto& [bit, name] : names)
    if (m & bit) s += (s.empty() ? "" : ",") + std::string(name);
  return s;
}

nlohmann::json kernels_json(uint8_t m) {
  nlohmann::json j = nlohmann::json::array();
  const std::string s = kernels_text(m);
  for (size_t b = 0; b < s.size();) {
    size_t e = s.find(',', b);
    if (e == std::string::npos) e = s.size();
    j.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return j;
}

void setup(CLI::App& app) {
  struct Opts {
    bool json = false, markdown = false;
    int dim = 128;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = tq::cli::subcommand(app, "kv-types",
      "List the KV cache formats (-ctk / -ctv / --kv-layer-type names): layout, parts (channels x bits,\n"
      "norm code), channel selection, rotation, bytes per head vector, head_dim constraint, the decode\n"
      "kernels that read each as K and as V, and a description.");
  sub->add_flag("--json", o->json, "print one JSON object on stdout");
  sub->add_flag("--markdown", o->markdown, "print a markdown table (the one in docs/design.md)");
  sub->add_option("--head-dim,-d", o->dim, "head_dim for the bytes column (a multiple of 16 in [16, 1024])")
      ->capture_default_str();
  sub->callback([o] {
    const auto& table = tq::kv_types();
    auto bytes = [&](const tq::KvTypeTraits& f) -> nlohmann::json {
      if (!f.supports(o->dim)) return nullptr;
      return f.row_bytes(o->dim);
    };
    TQ_CHECK(o->dim >= 16 && o->dim <= 1024 && o->dim % 16 == 0,
             "--head-dim %d: need a multiple of 16 in [16, 1024]", o->dim);
    if (o->json) {
      nlohmann::json rows = nlohmann::json::array();
      for (const auto& f : table) {
        nlohmann::json parts = nlohmann::json::array();
        for (int p = 0; p < f.n_parts; ++p)
          parts.push_back({{"bits", f.parts[p].bits}, {"channels", o->dim * f.parts[p].quarters / 4},
                           {"norm", tq::kv_norm_name(f.parts[p].norm)}});
        rows.push_back({{"name", f.name}, {"layout", tq::kv_layout_name(f.layout)}, {"rotated", f.rotated},
                        {"parts", parts}, {"channels", tq::kv_channels_name(f.channels)},
                        {"row_bytes", bytes(f)},
                        {"block_bytes", f.supports(o->dim) ? nlohmann::json(f.block_bytes(o->dim)) : nullptr},
                        {"head_dim_multiple", f.dim_multiple}, {"kernels_k", kernels_json(f.kernels_k)},
                        {"kernels_v", kernels_json(f.kernels_v)}, {"description", f.desc}});
      }
      tq::cli::print_json({{"head_dim", o->dim}, {"types", rows}});
      return;
    }
    if (o->markdown) {
      std::printf("| name | layout | parts (channels x bits, norm) | channels | rotated | bytes, D=%d | head_dim multiple of "
                  "| kernels K | kernels V | what |\n",
                  o->dim);
      std::printf("|---|---|---|---|---|---:|---:|---|---|---|\n");
      for (const auto& f : table)
        std::printf("| %s | %s | %s | %s | %s | %s | %d | %s | %s | %s |\n", f.name, tq::kv_layout_name(f.layout),
                    parts_text(f).c_str(), tq::kv_channels_name(f.channels), f.rotated ? "yes" : "no",
                    f.supports(o->dim) ? std::to_string(f.row_bytes(o->dim)).c_str() : "-", f.dim_multiple,
                    kernels_text(f.kernels_k).c_str(), kernels_text(f.kernels_v).c_str(), f.desc);
      return;
    }
    std::printf("%-8s %-8s %-30s %-14s %3s %6s %4s %-21s %-21s %s\n", "name", "layout", "parts", "channels", "rot",
                ("B/" + std::to_string(o->dim)).c_str(), "D%", "kernels K", "kernels V", "what");
    for (const auto& f : table)
      std::printf("%-8s %-8s %-30s %-14s %3s %6s %4d %-21s %-21s %s\n", f.name, tq::kv_layout_name(f.layout),
                  parts_text(f).c_str(), tq::kv_channels_name(f.channels), f.rotated ? "yes" : "no",
                  f.supports(o->dim) ? std::to_string(f.row_bytes(o->dim)).c_str() : "-", f.dim_multiple,
                  kernels_text(f.kernels_k).c_str(), kernels_text(f.kernels_v).c_str(), f.desc);
  });
}

tq::cli::Registrar reg("kv-types", setup);

}  // namespace
