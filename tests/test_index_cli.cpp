// IndexCli.*: `tq index build --ivf`, `search --nprobe`, `eval` (nprobe sweep, qps at the k
// asked, bytes on disk and in memory, the search description) through the built binary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "tq/common.h"
#include "tq/fileio.h"
#include "tq/index.h"
#include "tq/vecs.h"

namespace fs = std::filesystem;

namespace {

struct Data {
  fs::path dir;
  std::string base, queries, gt, queries_d5;
  size_t n = 3000, nq = 20;
  int d = 16;
  Data() {
    dir = fs::temp_directory_path() / ("tq_index_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    tq::Rng r(11);
    std::vector<float> c(8 * d), x(n * d), q(nq * d), q5(nq * 5);
    for (auto& v : c) v = static_cast<float>(r.normal());
    for (size_t i = 0; i < n; ++i) {
      const size_t ci = r.below(8);
      for (int j = 0; j < d; ++j) x[i * d + j] = c[ci * d + j] + 0.3f * static_cast<float>(r.normal());
    }
    for (size_t i = 0; i < nq; ++i)
      for (int j = 0; j < d; ++j) q[i * d + j] = x[i * 7 * d + j] + 0.05f * static_cast<float>(r.normal());
    for (auto& v : q5) v = static_cast<float>(r.normal());
    base = (dir / "base.fvecs").string();
    queries = (dir / "q.fvecs").string();
    queries_d5 = (dir / "q5.fvecs").string();
    gt = (dir / "gt.ivecs").string();
    tq::write_fvecs(base, n, d, x.data());
    tq::write_fvecs(queries, nq, d, q.data());
    tq::write_fvecs(queries_d5, nq, 5, q5.data());
    std::vector<float> s(nq * 10);
    std::vector<int64_t> ids(nq * 10);
    tq::exact_search(tq::Metric::cosine, n, d, x.data(), nq, q.data(), 10, s.data(), ids.data());
    std::vector<int32_t> g(ids.begin(), ids.end());
    tq::write_ivecs(gt, nq, 10, g.data());
  }
  ~Data() { fs::remove_all(dir); }
  std::string path(const std::string& f) const { return (dir / f).string(); }
};

nlohmann::json json_of(const tq_test::RunResult& r) {
  EXPECT_EQ(r.status, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

}  // namespace

TEST(IndexCli, IvfBuildSearchAndEvalSweep) {
  Data D;
  const std::string idx = D.path("ivf.tqi");
  auto b = json_of(tq_test::run_tq({"index", "build", "-i", D.base, "-o", idx, "--ivf", "8", "--bits", "4", "--json"}));
  EXPECT_EQ(b["nlist"], 8);
  EXPECT_EQ(b["file_bytes"].get<uint64_t>(), tq::file_size(idx));
  EXPECT_DOUBLE_EQ(b["disk_bytes_per_vector"].get<double>(), static_cast<double>(tq::file_size(idx)) / D.n);
  auto s = json_of(tq_test::run_tq({"index", "search", "--index", idx, "-q", D.queries, "-k", "5", "--nprobe", "8", "--json"}));
  EXPECT_EQ(s["ids"].size(), D.nq);
  EXPECT_EQ(s["ids"][0].size(), 5u);
  EXPECT_NE(s["index"].get<std::string>().find("nprobe 8"), std::string::npos);
  auto e = json_of(tq_test::run_tq({"index", "eval", "--base", D.base, "-q", D.queries, "--gt", D.gt, "--ivf", "8",
                                    "--nprobe", "1,2,8", "--reps", "1", "-k", "10", "--json"}));
  ASSERT_EQ(e["sweep"].size(), 3u);
  EXPECT_EQ(e["sweep"][2]["nprobe"], 8);
  // Probing every list is at least as good as probing one (the same codes, more of them).
  EXPECT_GE(e["sweep"][2]["recall_10_at_10"].get<double>(), e["sweep"][0]["recall_10_at_10"].get<double>());
  EXPECT_EQ(e["sweep"][0]["k"], 10);
  EXPECT_EQ(e["sweep"][0]["recall_10_at_10_search_k"], 10);
}

TEST(IndexCli, EvalReportsTheKAskedBothByteCountsAndTheSearchUsed) {
  Data D;
  auto e = json_of(tq_test::run_tq({"index", "eval", "--base", D.base, "-q", D.queries, "--gt", D.gt, "-k", "3",
                                    "--reps", "1", "--keep-vectors", "--json"}));
  EXPECT_EQ(e["k"], 3);
  EXPECT_EQ(e["k_max"], 64);
  // Recall@10 cannot come from a k = 3 search: it comes from the k-max search, and says so.
  EXPECT_EQ(e["recall_10_at_10_search_k"], 64);
  // Disk: 128-byte header + the mean (centred by default: d floats) + per vector (codes +
  // f16 scale) + 8-byte id + 4 d float kept vector.
  const double code = e["bytes_per_vector"].get<double>();
  EXPECT_DOUBLE_EQ(e["disk_bytes_per_vector"].get<double>(), (128.0 + 4.0 * D.d + D.n * (code + 8 + 4.0 * D.d)) / D.n);
  // Memory: 4-bit block layout (16 channels = 8 B), float scale, id, the kept floats.
  EXPECT_DOUBLE_EQ(e["memory_bytes_per_vector"].get<double>(), 8.0 + 4 + 8 + 4.0 * D.d);
  EXPECT_NE(e["index"].get<std::string>().find("fast-scan"), std::string::npos);
  auto f = json_of(tq_test::run_tq({"index", "eval", "--base", D.base, "-q", D.queries, "--gt", D.gt, "--reps", "1",
                                    "--no-fast-scan", "--json"}));
  EXPECT_EQ(f["index"].get<std::string>().find("fast-scan"), std::string::npos) << f["index"];
  EXPECT_NE(f["index"].get<std::string>().find("float-lut"), std::string::npos) << f["index"];
}

// peak_rss_mb is tq's own: Linux carries getrusage's ru_maxrss across execve, so a tq started
// by a larger process (a benchmark script holding the data) used to report that parent's size.
TEST(IndexCli, EvalPeakRssIsItsOwnNotItsParents) {
  Data D;
  std::vector<char> big(768u << 20);
  volatile char* page = big.data();  // volatile writes: the pages are touched, hence resident
  for (size_t i = 0; i < big.size(); i += 4096) page[i] = 1;
  auto e = json_of(tq_test::run_tq({"index", "eval", "--base", D.base, "-q", D.queries, "--gt", D.gt, "--reps", "1",
                                    "--json"}));
  EXPECT_GT(e["peak_rss_mb"].get<double>(), 0.0);
  EXPECT_LT(e["peak_rss_mb"].get<double>(), 384.0) << "this process holds " << (big.size() >> 20) << " MB";
}

TEST(IndexCli, IvfBadInputIsOneCleanError) {
  Data D;
  const std::string idx = D.path("ivf.tqi"), flat = D.path("flat.tqi");
  ASSERT_EQ(tq_test::run_tq({"index", "build", "-i", D.base, "-o", idx, "--ivf", "8"}).status, 0);
  ASSERT_EQ(tq_test::run_tq({"index", "build", "-i", D.base, "-o", flat}).status, 0);
  struct Case { std::vector<std::string> args; std::string needle; };
  const std::vector<Case> cases = {
      {{"index", "search", "--index", idx, "-q", D.queries, "--nprobe", "9"}, "nprobe"},
      {{"index", "search", "--index", idx, "-q", D.queries, "--nprobe", "0"}, "nprobe"},
      {{"index", "search", "--index", flat, "-q", D.queries, "--nprobe", "4"}, "IVF"},
      {{"index", "search", "--index", idx, "-q", D.queries_d5}, "dim"},
      {{"index", "build", "-i", D.base, "-o", D.path("x.tqi"), "--ivf", "5000"}, "at least 5000"},
      {{"index", "build", "-i", D.base, "-o", D.path("x.tqi"), "--ivf", "8", "--center"}, "center"},
      {{"index", "eval", "--base", D.base, "-q", D.queries, "--gt", D.gt, "--ivf", "4", "--nprobe", "1,5"}, "nprobe 5"},
      {{"index", "eval", "--base", D.base, "-q", D.queries, "--gt", D.gt, "--nprobe", "2"}, "flat"},
  };
  for (const auto& c : cases) {
    auto r = tq_test::run_tq(c.args);
    EXPECT_TRUE(tq_test::failed_cleanly(r)) << c.needle << ": status " << r.status << " err " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
  }
  // A truncated and a corrupted IVF file.
  auto bytes = tq::read_file_bytes(idx);
  tq::atomic_write_file(D.path("trunc.tqi"), bytes.data(), bytes.size() - 100);
  bytes[bytes.size() / 2] ^= 0x20;
  tq::atomic_write_file(D.path("flip.tqi"), bytes.data(), bytes.size());
  for (const char* f : {"trunc.tqi", "flip.tqi"}) {
    auto r = tq_test::run_tq({"index", "search", "--index", D.path(f), "-q", D.queries});
    EXPECT_TRUE(tq_test::failed_cleanly(r)) << f << ": " << r.err;
    EXPECT_NE(r.err.find(f), std::string::npos) << r.err;
  }
}

// --two-level off frees the sign plane (tq index search after the load, eval after the build):
// the same results as the single-level scan of an index that keeps it, in the fast layout's memory.
TEST(IndexCli, TwoLevelOffFreesTheSignPlane) {
  Data D;
  const int d = 320;  // the flat gate (kTwoLevelMinDim)
  const size_t n = 400, nq = 6;
  tq::Rng r(5);
  std::vector<float> x(n * d), q(nq * d);
  for (auto& v : x) v = static_cast<float>(r.normal());
  for (auto& v : q) v = static_cast<float>(r.normal());
  const std::string base = D.path("b320.fvecs"), qs = D.path("q320.fvecs"), gt = D.path("g320.ivecs"),
                    idx = D.path("i320.tqi");
  tq::write_fvecs(base, n, d, x.data());
  tq::write_fvecs(qs, nq, d, q.data());
  std::vector<float> es(nq * 10);
  std::vector<int64_t> eids(nq * 10);
  tq::exact_search(tq::Metric::cosine, n, d, x.data(), nq, q.data(), 10, es.data(), eids.data());
  const std::vector<int32_t> g(eids.begin(), eids.end());
  tq::write_ivecs(gt, nq, 10, g.data());
  json_of(tq_test::run_tq({"index", "build", "-i", base, "-o", idx, "--bits", "3", "--json"}));
  auto search = [&](const std::string& tl) {
    return json_of(tq_test::run_tq({"index", "search", "--index", idx, "-q", qs, "-k", "10", "--two-level", tl,
                                    "--json"}));
  };
  const auto on = search("auto"), off = search("off");
  EXPECT_NE(on["index"].get<std::string>().find("two-level"), std::string::npos) << on["index"];
  EXPECT_EQ(off["index"].get<std::string>().find("two-level"), std::string::npos) << off["index"];
  // Memory per vector: 3-bit codes packed (120 B) + the plane (40 B) and its two factors, or a
  // nibble a channel (160 B) without them; float scale and id either way (cosine: no norm).
  EXPECT_DOUBLE_EQ(on["memory_bytes_per_vector"].get<double>(), 120.0 + 40 + 8 + 4 + 8);
  EXPECT_DOUBLE_EQ(off["memory_bytes_per_vector"].get<double>(), 160.0 + 4 + 8);
  // The single-level scan of the freed index is that of the index keeping its plane: same ids
  // and scores.
  auto loaded = tq::Index::load(idx);
  ASSERT_TRUE(loaded.has_sign_plane());
  tq::SearchParams p;
  p.k = 10;
  p.two_level = 0;
  std::vector<float> ls(nq * 10);
  std::vector<int64_t> lids(nq * 10);
  loaded.search(nq, d, q.data(), p, ls.data(), lids.data());
  for (size_t i = 0; i < nq; ++i)
    for (size_t j = 0; j < 10; ++j) {
      EXPECT_EQ(off["ids"][i][j].get<int64_t>(), lids[i * 10 + j]);
      EXPECT_FLOAT_EQ(off["scores"][i][j].get<float>(), ls[i * 10 + j]);
    }
  auto eval = [&](const std::string& tl) {
    return json_of(tq_test::run_tq({"index", "eval", "--base", base, "-q", qs, "--gt", gt, "--bits", "3", "--reps",
                                    "1", "--two-level", tl, "--json"}));
  };
  const auto eon = eval("auto"), eoff = eval("off");
  EXPECT_DOUBLE_EQ(eon["memory_bytes_per_vector"].get<double>(), 120.0 + 40 + 8 + 4 + 8);
  EXPECT_DOUBLE_EQ(eoff["memory_bytes_per_vector"].get<double>(), 160.0 + 4 + 8);
  EXPECT_EQ(eoff["index"].get<std::string>().find("two-level"), std::string::npos) << eoff["index"];
}

// Defaults: a flat index is centred and scale-fitted unless told otherwise; IVF is neither.
TEST(IndexCli, FlatDefaultsAreCenterAndFitScale) {
  Data D;
  auto desc = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"index", "build", "-i", D.base, "-o", D.path("d.tqi"), "--json"};
    a.insert(a.end(), extra.begin(), extra.end());
    return json_of(tq_test::run_tq(a))["index"].get<std::string>();
  };
  EXPECT_NE(desc({}).find("+fit+center"), std::string::npos) << desc({});
  const std::string plain = desc({"--no-center", "--no-fit-scale"});
  EXPECT_EQ(plain.find("+fit"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("+center"), std::string::npos) << plain;
  EXPECT_NE(desc({"--no-center"}).find("+fit"), std::string::npos);
  const std::string ivf = desc({"--ivf", "4"});
  EXPECT_EQ(ivf.find("+fit"), std::string::npos) << ivf;
  EXPECT_EQ(ivf.find("+center"), std::string::npos) << ivf;
  EXPECT_NE(desc({"--ivf", "4", "--fit-scale"}).find("+fit"), std::string::npos);
  auto r = tq_test::run_tq({"index", "build", "-i", D.base, "-o", D.path("x.tqi"), "--center", "--no-center"});
  EXPECT_TRUE(tq_test::failed_cleanly(r)) << r.err;
  EXPECT_NE(r.err.find("contradict"), std::string::npos) << r.err;
}

// tq index remove / add / info edit a file as the library does in memory; -o leaves the input.
TEST(IndexCli, AddRemoveAndInfoEditTheFileAsTheLibraryDoes) {
  Data D;
  for (const std::vector<std::string>& build : {std::vector<std::string>{}, std::vector<std::string>{"--ivf", "6"}}) {
    const std::string f = D.path("e.tqi"), orig = D.path("orig.tqi");
    std::vector<std::string> a = {"index", "build", "-i", D.base, "-o", f};
    a.insert(a.end(), build.begin(), build.end());
    ASSERT_EQ(tq_test::run_tq(a).status, 0);
    fs::copy_file(f, orig, fs::copy_options::overwrite_existing);
    {
      std::FILE* fp = std::fopen(D.path("ids.txt").c_str(), "w");
      std::fputs("0 1,2\n3\n4 5 6 7 8 9 123456789\n", fp);
      std::fclose(fp);
    }
    auto r = json_of(tq_test::run_tq({"index", "remove", "--index", f, "--ids-file", D.path("ids.txt"), "--json"}));
    EXPECT_EQ(r["ids_given"], 11);
    EXPECT_EQ(r["removed"], 10);
    EXPECT_EQ(r["n"], D.n - 10);
    auto ad = json_of(tq_test::run_tq({"index", "add", "--index", f, "-i", D.queries, "--json"}));
    EXPECT_EQ(ad["added"], D.nq);
    EXPECT_EQ(ad["first_id"], D.n);  // after the largest id held (n - 1)
    EXPECT_EQ(ad["last_id"], D.n + D.nq - 1);
    auto info = json_of(tq_test::run_tq({"index", "info", "--index", f, "--json"}));
    EXPECT_EQ(info["n"], D.n - 10 + D.nq);
    EXPECT_EQ(info["next_id"], D.n + D.nq);
    EXPECT_EQ(info["dim"], D.d);
    EXPECT_EQ(info["file_bytes"].get<uint64_t>(), tq::file_size(f));
    EXPECT_EQ(info.contains("lists"), !build.empty());
    // The same edits in memory: the same file.
    auto idx = tq::Index::load(orig);
    std::vector<int64_t> gone = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    idx.remove_ids(gone.size(), gone.data());
    auto q = tq::read_vectors(D.queries);
    idx.add(q.n, q.data.data());
    idx.save(D.path("mem.tqi"));
    EXPECT_EQ(tq::read_file_bytes(D.path("mem.tqi")), tq::read_file_bytes(f));
    // -o writes elsewhere and leaves --index as it was.
    const auto before = tq::read_file_bytes(f);
    ASSERT_EQ(tq_test::run_tq({"index", "remove", "--index", f, "--ids", "10,11", "-o", D.path("o.tqi")}).status, 0);
    EXPECT_EQ(tq::read_file_bytes(f), before);
    EXPECT_EQ(json_of(tq_test::run_tq({"index", "info", "--index", D.path("o.tqi"), "--json"}))["n"],
              D.n - 12 + D.nq);
  }
  // Bad input: one clean error each, and the file unchanged.
  const std::string f = D.path("e.tqi");
  const auto before = tq::read_file_bytes(f);
  struct Case { std::vector<std::string> args; std::string needle; };
  const std::vector<Case> cases = {
      {{"index", "add", "--index", f, "-i", D.queries_d5}, "d=5"},
      {{"index", "remove", "--index", f, "--ids", "1,x2"}, "'x2' is not an id"},
      {{"index", "remove", "--index", f, "--ids", "99999999999999999999"}, "is not an id"},
      {{"index", "remove", "--index", f}, "--ids or --ids-file"},
      {{"index", "remove", "--index", f, "--ids", ","}, "no ids"},
      {{"index", "remove", "--index", f, "--ids-file", D.path("absent.txt")}, "absent.txt"},
      {{"index", "remove", "--index", D.path("absent.tqi"), "--ids", "1"}, "absent.tqi"},
      {{"index", "info", "--index", D.base}, "base.fvecs"},
  };
  for (const auto& c : cases) {
    auto r = tq_test::run_tq(c.args);
    EXPECT_TRUE(tq_test::failed_cleanly(r)) << c.needle << ": status " << r.status << " err " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
  }
  EXPECT_EQ(tq::read_file_bytes(f), before);
}
