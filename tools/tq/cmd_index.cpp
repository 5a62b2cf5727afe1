// tq index build | add | remove | info | search | eval: the compressed vector search index from the
// command line.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "tq/common.h"
#include "tq/error.h"
#include "tq/fileio.h"
#include "tq/index.h"
#include "tq/simd.h"
#include "tq/vecs.h"

namespace {

// Peak resident memory of this process image: VmHWM of /proc/self/status (Linux). getrusage's
// ru_maxrss is not used where VmHWM exists: Linux carries it across execve, so a tq started by
// a process larger than itself (a benchmark script holding the data) reported that parent's size.
double peak_rss_mb() {
  if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long kb = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    std::fclose(f);
    if (kb >= 0) return kb / 1024.0;
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

struct BuildOpts {
  double bits = 4;
  std::string metric = "cosine", codec = "mse", scale = "corrected", norm = "f16",
              rotation = "hadamard", law = "beta";
  uint64_t seed = 0x5eed;
  bool keep_vectors = false, fit_scale = false, center = false, ivf_list_mean = false, trellis = false;
  bool no_fit_scale = false, no_center = false;
  int threads = 0, ivf = 0, kmeans_iters = 10, rerank_bits = 0;
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
  // Defaults (docs/design.md "Defaults"): a flat index is built with --center --fit-scale,
  // which raised recall on GloVe-100 and Fashion-MNIST at 2 and 4 bits at no search cost;
  // an IVF index with neither (centring does not apply to residuals; fit-scale unmeasured).
  sub->add_flag("--fit-scale", o.fit_scale,
                "per-vector grid fit: try 9 grid scales 0.80..1.20 per vector, keep the codes with the\n"
                "best cosine to the vector (slower build, same bytes). Default for a flat index");
  sub->add_flag("--no-fit-scale", o.no_fit_scale, "flat index: nearest-centroid codes only (faster build)");
  sub->add_flag("--center", o.center,
                "subtract the mean of the first added batch before quantizing (dim floats per index).\n"
                "Default for a flat index");
  sub->add_flag("--no-center", o.no_center, "flat index: do not subtract the mean");
  sub->add_flag("--trellis", o.trellis,
                "flat index, 1-4 bits: trellis-coded channels (each vector's codes chosen together by a\n"
                "Viterbi search; ~0.68x the squared error at the same bits, higher recall; same bytes on\n"
                "disk, 1 byte per channel in memory), scanned with 256-entry byte tables (AVX-512 VBMI,\n"
                "else a plain loop); slower build and search than the default codes");
  sub->add_option("--threads,-t", o.threads, "threads (0: OpenMP default)")->capture_default_str()
      ->check(CLI::Range(0, 1024));
  sub->add_option("--ivf", o.ivf,
                  "IVF with NLIST lists (0: flat scan): k-means of the first batch, residual codes,\n"
                  "search scans --nprobe lists")->capture_default_str()->check(CLI::Range(0, 1 << 20));
  sub->add_option("--kmeans-iters", o.kmeans_iters, "IVF: Lloyd iterations of the coarse k-means")
      ->capture_default_str()->check(CLI::Range(1, 1000));
  sub->add_option("--rerank-bits", o.rerank_bits,
                  "IVF: also store a second-stage code at B bits per channel (1..8) that refines each\n"
                  "channel of the first code inside its quantization cell, read only to re-score the\n"
                  "--rerank shortlist (0: none; 4 bits over 4-bit codes rank like 8-bit codes)")
      ->capture_default_str()->check(CLI::Range(0, 8));
  sub->add_flag("--ivf-list-mean", o.ivf_list_mean,
                "IVF: residuals to the mean of each list's members instead of the k-means centroid");
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
  TQ_CHECK(!(o.center && o.no_center), "index: --center and --no-center contradict each other");
  TQ_CHECK(!(o.fit_scale && o.no_fit_scale), "index: --fit-scale and --no-fit-scale contradict each other");
  const bool mse = c.codec == tq::QuantizerKind::mse;
  c.fit_scale = o.fit_scale || (mse && o.ivf == 0 && !o.no_fit_scale);
  c.center = o.center || (mse && o.ivf == 0 && !o.no_center);
  c.nlist = o.ivf;
  c.kmeans_iters = o.kmeans_iters;
  c.ivf_list_mean = o.ivf_list_mean;
  c.rerank_bits = o.rerank_bits;
  c.trellis = o.trellis;
  return c;
}

// Adds in batches (progress on stderr); returns wall seconds spent in add() and, in *cpu,
// the process CPU seconds (all threads) spent there.
double build_into(tq::Index& idx, const tq::FloatMatrix& x, int threads, double* cpu = nullptr) {
  if (threads > 0) omp_set_num_threads(threads);
  double t = 0, c = 0;
  if (idx.nlist() > 0) {
    // IVF: one add, so the k-means trains on (a sample of) every vector, not the first batch;
    // its stages (k-means, assign, encode) report their own progress.
    std::unique_ptr<tq::cli::Progress> prog;
    std::string stage;
    const double t0 = tq::wall_seconds(), c0 = tq::cpu_seconds();
    idx.add(x.n, x.row(0), nullptr, [&](const char* s, size_t done, size_t total) {
      if (stage != s) {
        if (prog) prog->finish();
        stage = s;
        prog = std::make_unique<tq::cli::Progress>("index " + stage, total);
      }
      prog->update(done, total);
    });
    if (prog) prog->finish();
    if (cpu) *cpu = tq::cpu_seconds() - c0;
    return tq::wall_seconds() - t0;
  }
  tq::cli::Progress prog("index add", x.n);
  const size_t batch = size_t{1} << 16;
  // Flat: --center's mean from every vector of the file, as one add() of the whole matrix
  // fits it (the Python Index.add(x)), not from the first batch (a no-op without --center).
  // An index that has its fit already (tq index add to a file) keeps it.
  if (x.n > 0 && idx.size() == 0 && idx.center().empty()) {
    const double t0 = tq::wall_seconds(), c0 = tq::cpu_seconds();
    idx.train(x.n, x.row(0));
    t += tq::wall_seconds() - t0;
    c += tq::cpu_seconds() - c0;
  }
  for (size_t i = 0; i < x.n; i += batch) {
    const size_t m = std::min(batch, x.n - i);
    const double t0 = tq::wall_seconds(), c0 = tq::cpu_seconds();
    idx.add(m, x.row(i));
    t += tq::wall_seconds() - t0;
    c += tq::cpu_seconds() - c0;
    prog.update(i + m);
  }
  prog.finish();
  if (cpu) *cpu = c;
  return t;
}

// Ids in text: integers separated by commas or white space. Anything else is an error naming
// `where` and the token.
std::vector<int64_t> parse_ids(const std::string& text, const std::string& where) {
  std::vector<int64_t> out;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ',' || std::isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && text[j] != ',' && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    const std::string tok = text.substr(i, j - i);
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(tok.c_str(), &end, 10);
    if (end != tok.c_str() + tok.size() || errno != 0) {
      std::string shown;  // the token's first 40 bytes, those that do not print as \xHH
      for (unsigned char ch : tok.substr(0, 40)) shown += std::isprint(ch) ? std::string(1, static_cast<char>(ch)) : tq::strprintf("\\x%02X", ch);
      TQ_CHECK(false, "index remove: %s: '%s' is not an id (an int64)", where.c_str(), shown.c_str());
    }
    out.push_back(static_cast<int64_t>(v));
    i = j;
  }
  return out;
}

struct SearchOpts {
  int k = 10, rerank = -1, rerank_full = 0, threads = 0, nprobe = 1;
  bool no_fast_scan = false;
  std::string two_level = "auto";
};
void add_search_options(CLI::App* sub, SearchOpts& o, bool with_k) {
  if (with_k) sub->add_option("-k", o.k, "results per query")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  sub->add_option("--rerank", o.rerank,
                  "fast-scan candidates re-scored with exact float LUTs, or with the second-stage code of an\n"
                  "index built with --rerank-bits (-1: auto = k + 16; 0: off)")
      ->capture_default_str();
  sub->add_option("--rerank-full", o.rerank_full, "candidates re-scored with kept float vectors (0: off)")
      ->capture_default_str();
  sub->add_flag("--no-fast-scan", o.no_fast_scan, "score with float LUTs instead of the uint8 SIMD scan");
  sub->add_option("--two-level", o.two_level,
                  "first pass over 1 bit per dimension, full codes only for vectors that can still rank\n"
                  "(auto: on for fast-scan indexes of dim >= 320, IVF >= 192, with 3 to 4 bits per channel; on;\n"
                  "off: one level, and such an index frees its sign plane once loaded or built: less memory)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  if (with_k)
    sub->add_option("--nprobe", o.nprobe, "IVF: lists scanned per query (1..nlist)")->capture_default_str();
}
tq::SearchParams params_of(const SearchOpts& o, int k, int threads) {
  tq::SearchParams p;
  p.k = k;
  p.rerank = o.rerank;
  p.rerank_full = o.rerank_full;
  p.fast_scan = !o.no_fast_scan;
  p.n_threads = threads;
  p.nprobe = o.nprobe;
  p.two_level = o.two_level == "on" ? 1 : o.two_level == "off" ? 0 : -1;
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
                             {"nlist", idx.nlist()}, {"build_s", t}, {"blas_core", tq::simd::blas_core()},
                             {"bytes_per_vector", idx.code_bytes()},
                             {"disk_bytes_per_vector", idx.size() ? static_cast<double>(fs) / idx.size() : 0.0},
                             {"memory_bytes_per_vector", idx.memory_bytes_per_vector()},
                             {"file_bytes", fs}, {"output", o->output}});
      } else {
        std::printf("%s: %zu vectors, d=%d, %zu bytes/vector, built in %.3f s, %llu bytes -> %s\n",
                    idx.describe().c_str(), idx.size(), idx.dim(), idx.code_bytes(), t,
                    static_cast<unsigned long long>(fs), o->output.c_str());
      }
    });
  }

  // ---- add
  {
    struct O {
      std::string index, input, output;
      size_t max_n = SIZE_MAX;
      int threads = 0;
      bool json = false;
    };
    auto o = std::make_shared<O>();
    auto* sub = tq::cli::subcommand(*grp, "add",
        "Add the vectors of --input to an index file, coded with what the index fitted when it was\n"
        "built (rotation, center, IVF lists); ids continue after the largest id it holds. Writes\n"
        "the index back atomically (or to -o).\n"
        "Example: tq index add --index base.tqi --input more.fvecs");
    sub->add_option("--index", o->index, "index file (from tq index build)")->required();
    sub->add_option("--input,-i", o->input, "vectors to add (.fvecs, .bvecs or .npy)")->required();
    sub->add_option("--output,-o", o->output, "index file to write (default: --index, replaced atomically)");
    sub->add_option("--max-n", o->max_n, "add only the first N vectors");
    sub->add_option("--threads,-t", o->threads, "threads (0: OpenMP default)")->capture_default_str()
        ->check(CLI::Range(0, 1024));
    sub->add_flag("--json", o->json, "print one JSON object on stdout");
    sub->callback([o] {
      auto idx = tq::Index::load(o->index);
      auto x = tq::read_vectors(o->input, o->max_n);
      TQ_CHECK(x.d == static_cast<size_t>(idx.dim()), "index add: %s has d=%zu, the index d=%d", o->input.c_str(),
               x.d, idx.dim());
      const int64_t first = idx.next_id();
      const double t = build_into(idx, x, o->threads);
      const std::string out = o->output.empty() ? o->index : o->output;
      idx.save(out);
      const int64_t last = x.n ? first + static_cast<int64_t>(x.n) - 1 : first - 1;
      if (o->json) {
        tq::cli::print_json({{"index", idx.describe()}, {"added", x.n}, {"first_id", first}, {"last_id", last},
                             {"n", idx.size()}, {"add_s", t}, {"file_bytes", tq::file_size(out)}, {"output", out}});
      } else {
        std::printf("added %zu vectors (ids %lld..%lld) in %.3f s: %zu vectors -> %s\n", x.n,
                    static_cast<long long>(first), static_cast<long long>(last), t, idx.size(), out.c_str());
      }
    });
  }

  // ---- remove
  {
    struct O {
      std::string index, ids, ids_file, output;
      bool json = false;
    };
    auto o = std::make_shared<O>();
    auto* sub = tq::cli::subcommand(*grp, "remove",
        "Remove the vectors with the given ids from an index file (ids it does not hold are\n"
        "skipped; it prints how many vectors went); the rest keep their codes. Writes the index\n"
        "back atomically (or to -o).\n"
        "Example: tq index remove --index base.tqi --ids 17,42,1003");
    sub->add_option("--index", o->index, "index file (from tq index build)")->required();
    auto* ids = sub->add_option("--ids", o->ids, "ids to remove, comma-separated");
    auto* file = sub->add_option("--ids-file", o->ids_file, "text file of ids to remove (separated by spaces, commas or lines)");
    ids->excludes(file);
    sub->add_option("--output,-o", o->output, "index file to write (default: --index, replaced atomically)");
    sub->add_flag("--json", o->json, "print one JSON object on stdout");
    sub->callback([o] {
      TQ_CHECK(!o->ids.empty() || !o->ids_file.empty(), "index remove: give the ids with --ids or --ids-file");
      std::vector<int64_t> gone;
      if (!o->ids_file.empty()) {
        const auto bytes = tq::read_file_bytes(o->ids_file);
        gone = parse_ids(std::string(bytes.begin(), bytes.end()), o->ids_file);
      } else {
        gone = parse_ids(o->ids, "--ids");
      }
      TQ_CHECK(!gone.empty(), "index remove: %s holds no ids", o->ids_file.empty() ? "--ids" : o->ids_file.c_str());
      auto idx = tq::Index::load(o->index);
      const size_t before = idx.size();
      const size_t removed = idx.remove_ids(gone.size(), gone.data());
      const std::string out = o->output.empty() ? o->index : o->output;
      idx.save(out);
      if (o->json) {
        tq::cli::print_json({{"index", idx.describe()}, {"ids_given", gone.size()}, {"removed", removed},
                             {"n_before", before}, {"n", idx.size()}, {"file_bytes", tq::file_size(out)},
                             {"output", out}});
      } else {
        std::printf("removed %zu vectors (%zu ids given): %zu vectors -> %s\n", removed, gone.size(), idx.size(),
                    out.c_str());
      }
    });
  }

  // ---- info
  {
    struct O {
      std::string index;
      bool json = false;
    };
    auto o = std::make_shared<O>();
    auto* sub = tq::cli::subcommand(*grp, "info",
        "What an index file holds: its codes, vectors, bytes and (IVF) list sizes.\n"
        "Example: tq index info --index base.tqi --json");
    sub->add_option("--index", o->index, "index file")->required();
    sub->add_flag("--json", o->json, "print one JSON object on stdout");
    sub->callback([o] {
      const auto idx = tq::Index::load(o->index);
      const uint64_t fs = tq::file_size(o->index);
      size_t lmin = 0, lmax = 0, lempty = 0;
      for (int l = 0; l < idx.nlist(); ++l) {
        const size_t s = idx.list_size(l);
        lmin = l == 0 ? s : std::min(lmin, s);
        lmax = std::max(lmax, s);
        lempty += s == 0;
      }
      // The id `tq index add` would start from (none when the index holds INT64_MAX).
      nlohmann::json next = nullptr;
      try {
        next = idx.next_id();
      } catch (const tq::Error&) {
      }
      nlohmann::json j = {{"index", idx.describe()}, {"n", idx.size()}, {"dim", idx.dim()},
                          {"metric", tq::metric_name(idx.config().metric)}, {"bits", idx.config().bits},
                          {"nlist", idx.nlist()}, {"next_id", next},
                          {"bytes_per_vector", idx.code_bytes()}, {"file_bytes", fs},
                          {"memory_bytes_per_vector", idx.memory_bytes_per_vector()}};
      if (idx.nlist() > 0) j["lists"] = {{"min", lmin}, {"max", lmax}, {"empty", lempty}};
      if (o->json) {
        tq::cli::print_json(j);
        return;
      }
      std::printf("%s\n  n=%zu d=%d, %zu bytes/vector, %llu bytes on disk, %.1f bytes/vector in memory\n",
                  idx.describe().c_str(), idx.size(), idx.dim(), idx.code_bytes(),
                  static_cast<unsigned long long>(fs), idx.memory_bytes_per_vector());
      if (idx.nlist() > 0)
        std::printf("  %d lists: %zu..%zu vectors, %zu empty\n", idx.nlist(), lmin, lmax, lempty);
      std::printf("  next default id: %s\n", next.is_null() ? "none (the index holds INT64_MAX)" : next.dump().c_str());
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
        "query (id:score ...) or, with --json, {\"k\", \"ids\": [[...]], \"scores\": [[...]]} with\n"
        "load_s, search_s and memory_bytes_per_vector (the index as searched).\n"
        "Scores: similarity for ip/cosine (higher is nearer), squared distance for l2.\n"
        "Example: tq index search --index base.tqi --queries query.fvecs -k 10 --json");
    sub->add_option("--index", o->index, "index file (from tq index build)")->required();
    sub->add_option("--queries,-q", o->queries, "query vectors (.fvecs, .bvecs or .npy)")->required();
    sub->add_option("--max-queries", o->max_q, "use only the first N queries");
    sub->add_option("--threads,-t", o->s.threads, "threads (0: OpenMP default)")->check(CLI::Range(0, 1024));
    add_search_options(sub, o->s, true);
    sub->add_flag("--json", o->json, "print one JSON object on stdout");
    sub->callback([o] {
      const double tl0 = tq::wall_seconds();
      auto idx = tq::Index::load(o->index);
      if (o->s.two_level == "off") idx.release_sign_plane();  // never searched: its memory back
      const double load_s = tq::wall_seconds() - tl0;
      TQ_CHECK(idx.nlist() > 0 || o->s.nprobe == 1, "search: --nprobe %d needs an IVF index (tq index build --ivf NLIST)",
               o->s.nprobe);
      auto q = tq::read_vectors(o->queries, o->max_q);
      const size_t k = static_cast<size_t>(o->s.k);
      std::vector<float> s(q.n * k);
      std::vector<int64_t> ids(q.n * k);
      const double t0 = tq::wall_seconds();
      idx.search(q.n, q.d, q.data.data(), params_of(o->s, o->s.k, o->s.threads), s.data(), ids.data());
      const double t = tq::wall_seconds() - t0;
      if (o->json) {
        nlohmann::json jid = nlohmann::json::array(), js = nlohmann::json::array();
        for (size_t i = 0; i < q.n; ++i) {
          jid.push_back(std::vector<int64_t>(ids.begin() + i * k, ids.begin() + (i + 1) * k));
          nlohmann::json row = nlohmann::json::array();
          for (size_t j = 0; j < k; ++j) row.push_back(std::isfinite(s[i * k + j]) ? nlohmann::json(s[i * k + j]) : nlohmann::json());
          js.push_back(row);
        }
        tq::cli::print_json({{"index", idx.describe_search(params_of(o->s, o->s.k, o->s.threads))}, {"k", k}, {"nq", q.n},
                             {"nprobe", o->s.nprobe},
                             {"load_s", load_s}, {"search_s", t},
                             {"memory_bytes_per_vector", idx.memory_bytes_per_vector()}, {"ids", jid},
                             {"scores", js}});
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
      int k = 10, k_max = 64, reps = 3, build_reps = 0;
      std::vector<int> nprobe{1};
      bool json = false;
      BuildOpts b;
      SearchOpts s;
    };
    auto o = std::make_shared<O>();
    auto* sub = tq::cli::subcommand(*grp, "eval",
        "Build an index of --base, search --queries and score against the ground truth --gt\n"
        "(.ivecs, exact neighbour ids per query, best first). Reports qps and search_s (median\n"
        "over --reps searches of all queries at the -k given), recall_10_at_10 (from those\n"
        "searches when k >= 10, else from the k-max search), recall_1_at_k (share of queries whose\n"
        "true top-1 is among the first k returned, k = 1, 2, 4, ..., k-max, from one more search\n"
        "with k = k-max), build_s (median wall time of --build-reps add()s; build_cpu_s: CPU seconds of all\n"
        "threads), bytes_per_vector (codes + norms), disk_bytes_per_vector (the saved file: ids,\n"
        "kept floats and IVF centroids included) and memory_bytes_per_vector (in memory, likewise);\n"
        "simd and blas_core name the kernels that ran (the SIMD level, OpenBLAS's kernel set).\n"
        "IVF (--ivf NLIST): --nprobe takes a list (e.g. 1,2,4,8,16); the JSON has one entry per\n"
        "value in \"sweep\" and the top-level fields of the first.\n"
        "Example: tq index eval --base base.fvecs --queries q.fvecs --gt gt.ivecs --bits 4\n"
        "         --metric cosine --threads 2 --json");
    sub->add_option("--base", o->base, "database vectors")->required();
    sub->add_option("--queries,-q", o->queries, "query vectors")->required();
    sub->add_option("--gt", o->gt, "ground-truth neighbour ids (.ivecs)")->required();
    sub->add_option("--max-n", o->max_n, "use only the first N base vectors (the ground truth must match)");
    sub->add_option("--max-queries", o->max_q, "use only the first N queries");
    sub->add_option("-k", o->k, "results per query of the timed searches")->capture_default_str()
        ->check(CLI::Range(1, 4096));
    sub->add_option("--k-max", o->k_max, "largest k of recall_1_at_k (a power of two)")->capture_default_str()
        ->check(CLI::Range(1, 4096));
    sub->add_option("--reps", o->reps, "timed builds / searches (medians reported)")->capture_default_str()
        ->check(CLI::Range(1, 100));
    sub->add_option("--build-reps", o->build_reps, "timed builds (median reported); 0: as --reps")
        ->capture_default_str()->check(CLI::Range(0, 100));
    sub->add_option("--nprobe", o->nprobe, "IVF: lists scanned per query; several values sweep")
        ->delimiter(',')->capture_default_str();
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
      TQ_CHECK(!o->nprobe.empty(), "eval: --nprobe needs at least one value");
      for (int np : o->nprobe)
        TQ_CHECK(np >= 1 && (o->b.ivf > 0 ? np <= o->b.ivf : np == 1),
                 "eval: --nprobe %d outside [1, %d]%s", np, std::max(1, o->b.ivf),
                 o->b.ivf > 0 ? "" : " (a flat index; --ivf NLIST builds an IVF index)");
      const int threads = o->b.threads > 0 ? o->b.threads : omp_get_max_threads();
      const auto cfg = config_of(o->b, static_cast<int>(x.d));
      std::vector<double> builds, build_cpus;
      std::unique_ptr<tq::Index> idx;
      const int build_reps = o->build_reps > 0 ? o->build_reps : o->reps;
      for (int r = 0; r < build_reps; ++r) {
        auto fresh = std::make_unique<tq::Index>(cfg);
        double c = 0;
        builds.push_back(build_into(*fresh, x, threads, &c));
        build_cpus.push_back(c);
        idx = std::move(fresh);
      }
      if (o->s.two_level == "off") idx->release_sign_plane();  // as tq index search does
      std::sort(builds.begin(), builds.end());
      std::sort(build_cpus.begin(), build_cpus.end());
      const double bs = builds[builds.size() / 2];
      const size_t file_b = idx->file_bytes();
      const double disk_bpv = x.n ? static_cast<double>(file_b) / x.n : 0.0;
      const int K = o->k_max, k = o->k;
      const size_t kk = static_cast<size_t>(K), ks = static_cast<size_t>(k);
      // Share of each query's true top-10 among its first 10 results (rows of width w).
      auto r10_of = [&](const std::vector<int64_t>& ids, size_t w) {
        size_t hit = 0;
        for (size_t i = 0; i < q.n; ++i)
          for (int j = 0; j < 10; ++j)
            for (int t = 0; t < 10; ++t)
              if (ids[i * w + j] == gt.row(i)[t]) { ++hit; break; }
        return static_cast<double>(hit) / (10.0 * q.n);
      };
      nlohmann::json sweep = nlohmann::json::array();
      for (int np : o->nprobe) {
        SearchOpts so = o->s;
        so.nprobe = np;
        // Timed: k as given.
        std::vector<float> s(q.n * ks);
        std::vector<int64_t> ids(q.n * ks);
        const auto p = params_of(so, k, threads);
        std::vector<double> times;
        for (int r = 0; r < o->reps; ++r) {
          const double t0 = tq::wall_seconds();
          idx->search(q.n, q.d, q.data.data(), p, s.data(), ids.data());
          times.push_back(tq::wall_seconds() - t0);
        }
        std::sort(times.begin(), times.end());
        const double ts = times[times.size() / 2];
        // Untimed: k = k-max for the recall_1_at_k curve.
        std::vector<float> sK(q.n * kk);
        std::vector<int64_t> idsK(q.n * kk);
        idx->search(q.n, q.d, q.data.data(), params_of(so, K, threads), sK.data(), idsK.data());
        nlohmann::json r1 = nlohmann::json::object();
        for (int kq = 1; kq <= K; kq *= 2) {
          size_t hit = 0;
          for (size_t i = 0; i < q.n; ++i)
            for (int j = 0; j < kq; ++j)
              if (idsK[i * kk + j] == gt.row(i)[0]) { ++hit; break; }
          r1[std::to_string(kq)] = static_cast<double>(hit) / q.n;
        }
        nlohmann::json r10 = nullptr;
        int r10_k = 0;
        if (gt.d >= 10 && k >= 10) {
          r10 = r10_of(ids, ks);
          r10_k = k;
        } else if (gt.d >= 10 && K >= 10) {
          r10 = r10_of(idsK, kk);
          r10_k = K;
        }
        sweep.push_back({{"nprobe", np}, {"k", k}, {"search", idx->describe_search(p)}, {"qps", q.n / ts}, {"search_s", ts},
                         {"recall_10_at_10", r10}, {"recall_10_at_10_search_k", r10_k},
                         {"recall_1_at_k", r1}});
      }
      const auto& f = sweep[0];
      if (o->json) {
        nlohmann::json j = {{"index", f["search"]}, {"n", x.n}, {"nq", q.n}, {"dim", x.d},
                            {"bits", o->b.bits}, {"metric", o->b.metric}, {"threads", threads},
                            {"simd", tq::simd::current_level()}, {"blas_core", tq::simd::blas_core()},
                            {"k", k}, {"k_max", K}, {"nlist", o->b.ivf},
                            {"nprobe", f["nprobe"]}, {"recall_1_at_k", f["recall_1_at_k"]},
                            {"recall_10_at_10", f["recall_10_at_10"]},
                            {"recall_10_at_10_search_k", f["recall_10_at_10_search_k"]},
                            {"build_s", bs}, {"build_cpu_s", build_cpus[build_cpus.size() / 2]},
                            {"qps", f["qps"]}, {"search_s", f["search_s"]},
                            {"bytes_per_vector", idx->code_bytes()},
                            {"disk_bytes_per_vector", disk_bpv}, {"file_bytes", file_b},
                            {"memory_bytes_per_vector", idx->memory_bytes_per_vector()},
                            {"peak_rss_mb", peak_rss_mb()}};
        if (o->b.ivf > 0) j["sweep"] = sweep;
        tq::cli::print_json(j);
        return;
      }
      std::printf("%s  n=%zu nq=%zu d=%zu threads=%d simd=%s k=%d\n", f["search"].get<std::string>().c_str(), x.n, q.n, x.d,
                  threads, tq::simd::current_level().c_str(), k);
      std::printf("  build_s: %.4f (cpu %.4f)\n  bytes_per_vector: %zu (disk %.1f, memory %.1f)\n  peak_rss_mb: %.0f\n",
                  bs, build_cpus[build_cpus.size() / 2], idx->code_bytes(), disk_bpv, idx->memory_bytes_per_vector(),
                  peak_rss_mb());
      for (const auto& e : sweep) {
        std::printf("  nprobe %d: qps %.0f  recall_10_at_10 %s  recall_1_at_k:", e["nprobe"].get<int>(),
                    e["qps"].get<double>(), e["recall_10_at_10"].dump().c_str());
        for (auto& [kq, v] : e["recall_1_at_k"].items()) std::printf(" @%s=%.4f", kq.c_str(), v.get<double>());
        std::printf("\n");
      }
    });
  }
}

tq::cli::Registrar reg("index", setup);

}  // namespace
