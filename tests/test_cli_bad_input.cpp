// CliBadInput.*: runs the built `tq` binary (TQ_CLI_PATH) with bad input for every
// subcommand: missing / empty / directory-instead-of-file / truncated inputs, unknown type
// names, out-of-range and non-numeric numbers, unknown options. Each case must give a
// non-zero exit, exactly one line `tq: error: ...` on stderr that names the problem, nothing
// on stdout, and leave no output file (or temporary) behind.
//
// The cases are data: tests/cli_bad_input_cases.json holds each one's arguments, the words
// its error must contain (any one of them), and the exit status and error line it gives,
// which the tests check too; scripts/reliability_table.py renders the file into
// RELIABILITY.md's bad-input table (ctest Docs.ReliabilityTable fails when it is stale).
// Paths in the file: $TMP/ is the test's temp directory of fixtures, $SRC/ the source tree;
// $PID stands for the process id in a temporary file's name.
// With TQ_BAD_INPUT_RECORD=<file> every case run is written there with what it gave (the
// same layout: after an intended change of a message, record, review, copy over the file).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "llm_test_util.h"
#include "tq/fileio.h"
#include "tq/gguf.h"
#include "tq/index.h"
#include "tq/vecs.h"

namespace fs = std::filesystem;

namespace {

using tq_test::RunResult;
using tq_test::run_tq;

std::string join(const std::vector<std::string>& a) {
  std::string s;
  for (auto& x : a) {
    if (!s.empty()) s += ' ';
    s += x.empty() ? "''" : x;
  }
  return s;
}

struct TempDir {
  fs::path dir;
  TempDir() {
    dir = fs::temp_directory_path() / ("tq_bad_input_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  std::set<std::string> listing() const {
    std::set<std::string> s;
    for (auto& e : fs::recursive_directory_iterator(dir)) s.insert(e.path().string());
    return s;
  }
};

// Every case run, with what it gave, for TQ_BAD_INPUT_RECORD (the layout of the case file).
nlohmann::json& recorded() {
  static nlohmann::json cases = nlohmann::json::array();
  return cases;
}
struct Recorder : ::testing::Environment {
  void TearDown() override {
    const char* path = std::getenv("TQ_BAD_INPUT_RECORD");
    if (!path || !*path) return;
    std::ofstream f(path);  // one case a line, as the case file
    f << "{\"cases\": [\n";
    for (size_t i = 0; i < recorded().size(); ++i) f << recorded()[i].dump() << (i + 1 < recorded().size() ? ",\n" : "\n");
    f << "]}\n";
  }
};
[[maybe_unused]] auto* const g_recorder = ::testing::AddGlobalTestEnvironment(new Recorder);

const std::string kCaseFile = std::string(TQ_SOURCE_DIR) + "/tests/cli_bad_input_cases.json";

// tests/cli_bad_input_cases.json: {"cases": [{"group", "entry", "what", "args", "expect", "exit",
// "error"[, "error_varies_after"]}]}; group names the TEST that runs the case.
const nlohmann::json& case_file() {
  static const nlohmann::json j = [] {
    std::ifstream f(kCaseFile);
    if (!f) return nlohmann::json::object();
    return nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  }();
  return j;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) s.replace(p, from.size(), to);
}

// The temp dir and the source tree as $TMP/ and $SRC/, as the case file writes them, and the
// process id in an atomic write's temporary name (FILE.tmp.PID.N) as $PID.
std::string symbolic(std::string s, const TempDir* dir) {
  if (dir) replace_all(s, dir->dir.string() + "/", "$TMP/");
  replace_all(s, std::string(TQ_SOURCE_DIR) + "/", "$SRC/");
  static const std::regex pid(R"(\.tmp\.[0-9]+\.)");
  return std::regex_replace(s, pid, ".tmp.$$PID.");
}
std::string concrete(std::string s, const TempDir* dir) {
  if (dir) replace_all(s, "$TMP/", dir->dir.string() + "/");
  replace_all(s, "$SRC/", std::string(TQ_SOURCE_DIR) + "/");
  return s;
}

// Runs one bad-input case and checks the contract. `expect` are substrings (any one of
// them) that must appear in the error line: the thing that is wrong. `want`, the case's entry
// in the case file, also fixes the exit status and the error line (what RELIABILITY.md shows).
void expect_clean_error(const std::string& entry, const std::string& what, const std::vector<std::string>& args,
                        const std::vector<std::string>& expect, const TempDir* dir = nullptr,
                        const nlohmann::json* want = nullptr) {
  SCOPED_TRACE("tq " + join(args));
  const auto before = dir ? dir->listing() : std::set<std::string>{};
  const RunResult r = run_tq(args);
  const bool one_line = tq_test::one_error_line(r.err);
  EXPECT_NE(r.status, 0) << "exit code";
  EXPECT_LT(r.status, 128) << "killed by a signal: " << r.err;
  EXPECT_TRUE(r.out.empty()) << "stdout: " << r.out;
  EXPECT_TRUE(one_line) << "expected exactly one line 'tq: error: ...' on stderr, got: " << r.err;
  bool named = expect.empty();
  for (auto& e : expect) named = named || r.err.find(e) != std::string::npos;
  EXPECT_TRUE(named) << "error does not name the problem (" << join(expect) << "): " << r.err;
  if (dir) EXPECT_TRUE(dir->listing() == before) << "files left behind";
  const std::string line = symbolic(r.err.substr(0, r.err.find('\n')), dir);
  if (want) {
    const std::string stale = " (RELIABILITY.md shows it: update " + kCaseFile +
                              ", e.g. from a TQ_BAD_INPUT_RECORD=FILE run, then python3 scripts/reliability_table.py)";
    EXPECT_EQ(r.status, want->value("exit", -1)) << "exit status" << stale;
    const std::string error = want->value("error", "");
    const std::string varies = want->value("error_varies_after", "");
    if (varies.empty()) {
      EXPECT_EQ(line, error) << "error line" << stale;
    } else {  // the part after the marker depends on the machine (e.g. its SIMD levels)
      const size_t p = error.find(varies);
      EXPECT_NE(p, std::string::npos) << "error_varies_after not in error";
      EXPECT_EQ(line.substr(0, p + varies.size()), error.substr(0, p + varies.size())) << "error line" << stale;
    }
  }
  nlohmann::json c = {{"group", ::testing::UnitTest::GetInstance()->current_test_info()->name()},
                      {"entry", entry}, {"what", what}, {"args", nlohmann::json::array()}, {"expect", expect},
                      {"exit", r.status}, {"error", line}};
  if (want && want->contains("error_varies_after")) c["error_varies_after"] = (*want)["error_varies_after"];
  for (const auto& x : args) c["args"].push_back(symbolic(x, dir));
  recorded().push_back(c);
}

// Runs every case of `group` (the calling TEST's name) from the case file.
void run_cases(const std::string& group, const TempDir* dir = nullptr) {
  ASSERT_TRUE(case_file().is_object() && case_file().contains("cases")) << "cannot read " << kCaseFile;
  int n = 0;
  for (const auto& c : case_file()["cases"]) {
    if (c.value("group", "") != group) continue;
    ++n;
    std::vector<std::string> args;
    for (const auto& a : c.at("args")) args.push_back(concrete(a.get<std::string>(), dir));
    expect_clean_error(c.at("entry").get<std::string>(), c.at("what").get<std::string>(), args, c.at("expect").get<std::vector<std::string>>(), dir, &c);
  }
  EXPECT_GT(n, 0) << "no cases of group " << group << " in " << kCaseFile;
}

// The case of `args` in the case file, or nullptr.
const nlohmann::json* find_case(const std::string& group, const std::vector<std::string>& args) {
  if (!case_file().contains("cases")) return nullptr;
  for (const auto& c : case_file()["cases"])
    if (c.value("group", "") == group && c.at("args").get<std::vector<std::string>>() == args) return &c;
  return nullptr;
}

// Leaf subcommands listed by `tq [group] --help` (CLI11's "Subcommands:" section).
std::vector<std::vector<std::string>> list_commands(const std::vector<std::string>& prefix = {}) {
  std::vector<std::string> args = prefix;
  args.push_back("--help");
  const RunResult r = run_tq(args);
  std::vector<std::vector<std::string>> out;
  std::istringstream in(r.out);
  std::string line;
  bool in_subs = false;
  while (std::getline(in, line)) {
    if (line.rfind("Subcommands:", 0) == 0) {
      in_subs = true;
      continue;
    }
    if (!in_subs) continue;
    if (!line.empty() && line[0] != ' ') {
      in_subs = false;
      continue;
    }
    // "  name   help": two spaces then the name; wrapped help lines are indented further.
    if (line.size() < 3 || line[0] != ' ' || line[1] != ' ' || line[2] == ' ') continue;
    std::istringstream ls(line);
    std::string name;
    ls >> name;
    if (name.empty()) continue;
    std::vector<std::string> cmd = prefix;
    cmd.push_back(name);
    // A group has its own subcommands.
    auto sub = list_commands(cmd);
    if (sub.empty()) out.push_back(cmd);
    else out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST(CliBadInput, BinaryRuns) {
  const RunResult r = run_tq({"--help"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("codebook"), std::string::npos);
}

// Every subcommand, whatever branch added it: an unknown option and an unknown subcommand.
TEST(CliBadInput, EveryCommandRejectsUnknownOptions) {
  const auto cmds = list_commands();
  ASSERT_GE(cmds.size(), 3u) << "expected at least codebook, distortion, bench codec";
  const std::string group = "EveryCommandRejectsUnknownOptions";
  // Commands with required options may report the missing one first: also a clean error.
  // A subcommand the case file lacks (a new one) is run too, and fails until the file has it.
  const std::vector<std::pair<std::string, std::string>> kinds = {{"unknown option", "--no-such-option"},
                                                                  {"stray argument", "stray-positional-arg"}};
  std::set<std::vector<std::string>> generic;
  for (const auto& c : cmds) {
    for (const auto& [what, arg] : kinds) {
      const auto args = with(c, {arg});
      generic.insert(args);
      const nlohmann::json* want = find_case(group, args);
      EXPECT_NE(want, nullptr) << "tq " << join(args) << " is not in " << kCaseFile
                               << " (RELIABILITY.md's table lists every subcommand)";
      expect_clean_error("tq " + join(c), what, args, {arg, "is required"}, nullptr, want);
    }
  }
  // The group's other cases (no subcommand, unknown subcommand, unknown SIMD level); a
  // generic case for a subcommand `tq --help` no longer lists is stale.
  int others = 0;
  for (const auto& c : case_file().value("cases", nlohmann::json::array())) {
    if (c.value("group", "") != group) continue;
    const auto args = c.at("args").get<std::vector<std::string>>();
    if (generic.count(args)) continue;
    EXPECT_FALSE(!args.empty() && (args.back() == "--no-such-option" || args.back() == "stray-positional-arg"))
        << "tq " << join(args) << ": a case for a subcommand tq --help does not list";
    ++others;
    expect_clean_error(c.at("entry").get<std::string>(), c.at("what").get<std::string>(), args, c.at("expect").get<std::vector<std::string>>(), nullptr, &c);
  }
  EXPECT_GE(others, 3);
}

TEST(CliBadInput, Codebook) {
  run_cases("Codebook");
}

TEST(CliBadInput, Distortion) {
  run_cases("Distortion");
}

// `--seed -1` used to be accepted by CLI11 as 2^64 - 1 for a uint64_t option; regression test.
TEST(CliBadInput, DistortionNegativeSeed) {
  run_cases("DistortionNegativeSeed");
}

TEST(CliBadInput, BenchCodec) {
  run_cases("BenchCodec");
}

namespace {

// GPT-2 byte-level BPE: the printable character that stands for byte b.
std::string byte_token(int b) {
  const bool direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  int cp = b;
  if (!direct) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    cp = 256 + n;
  }
  std::string u;
  if (cp < 0x80) {
    u.push_back(static_cast<char>(cp));
  } else {
    u.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    u.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return u;
}

// Fixtures in one temp dir: a tiny llama with a byte-level tokenizer (valid), truncated and
// empty copies, a directory, vector files and a saved index.
struct Fixtures {
  TempDir dir;
  std::string model, truncated_model, empty, folder, text, base, queries, queries_d5, gt, gt_bad, index,
      corrupt_index, truncated_fvecs, nan_fvecs, huge_fvecs, ivf_index, ivf_truncated, ivf_corrupt, ivf_version6,
      ivf_rerank, ivf_rerank_truncated, ivf_rerank_corrupt, ivf_rerank_width, ivf_indep_width, ivf_nan_centroid,
      ivf_huge_centroid;
  // The fixture model (weights from `seed`): a tiny llama with a byte-level tokenizer.
  static tq::GgufWriter tiny_model(uint64_t seed) {
    tq_test::TinyLlama c;
    c.n_vocab = 3 + 256;
    tq::GgufWriter w = tq_test::tiny_llama_gguf(c, tq::GgmlType::F16, seed);
    std::vector<std::string> toks = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    std::vector<int32_t> types = {3, 3, 3};
    for (int b = 0; b < 256; ++b) {
      toks.push_back(byte_token(b));
      types.push_back(1);
    }
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "smollm");
    w.set_str_array("tokenizer.ggml.tokens", toks);
    w.set_i32_array("tokenizer.ggml.token_type", types);
    w.set_str_array("tokenizer.ggml.merges", {});
    w.set_u32("tokenizer.ggml.bos_token_id", 1);
    w.set_u32("tokenizer.ggml.eos_token_id", 2);
    return w;
  }
  Fixtures() {
    tq::GgufWriter w = tiny_model(7);
    model = dir.path("tiny.gguf");
    w.write(model);
    const auto bytes = w.bytes();
    truncated_model = dir.path("truncated.gguf");
    write(truncated_model, bytes.data(), bytes.size() / 2);
    empty = dir.path("empty.bin");
    write(empty, nullptr, 0);
    folder = dir.path("a_directory");
    fs::create_directories(folder);
    text = dir.path("text.txt");
    std::string t;
    for (int i = 0; i < 400; ++i) t += "the quick brown fox jumps over the lazy dog. ";
    write(text, t.data(), t.size());
    // Saved sensitivities (tq calibrate --save-sens) for the --sens cases: the fixture model's
    // shape at ctx 32 and 64, and ones of other candidates, another shape, another model file.
    write_sens("sens_c32.json", 32, 2, "tq4n8", "tiny.gguf");
    write_sens("sens_c64.json", 64, 2, "tq4n8", "tiny.gguf");
    write_sens("sens_c32_other_types.json", 32, 2, "tq3n8", "tiny.gguf");
    write_sens("sens_c32_3_layers.json", 32, 3, "tq4n8", "tiny.gguf");
    write_sens("sens_c32_other_model.json", 32, 2, "tq4n8", "other.gguf");
    // Of a model with the fixture's name and shape but other weights (its model_id says so).
    write_sens("sens_c32_other_id.json", 32, 2, "tq4n8", "tiny.gguf",
               {{"arch", "llama"}, {"n_layers", 2}, {"n_kv_heads", 2}, {"head_dim", 16}, {"file_bytes", 54321},
                {"tensors_xxh3", "0123456789abcdef"}});

    const size_t n = 64, d = 8, nq = 4;
    tq::Rng r(3);
    std::vector<float> x(n * d), q(nq * d), q5(nq * 5);
    for (auto& v : x) v = static_cast<float>(r.normal());
    for (auto& v : q) v = static_cast<float>(r.normal());
    for (auto& v : q5) v = static_cast<float>(r.normal());
    base = dir.path("base.fvecs");
    tq::write_fvecs(base, n, d, x.data());
    queries = dir.path("queries.fvecs");
    tq::write_fvecs(queries, nq, d, q.data());
    queries_d5 = dir.path("queries_d5.fvecs");
    tq::write_fvecs(queries_d5, nq, 5, q5.data());
    std::vector<int32_t> g(nq * 10), gb(nq * 10);
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = static_cast<int32_t>(i % n);
      gb[i] = static_cast<int32_t>(n + 1000);  // ids past the base
    }
    gt = dir.path("gt.ivecs");
    tq::write_ivecs(gt, nq, 10, g.data());
    gt_bad = dir.path("gt_bad.ivecs");
    tq::write_ivecs(gt_bad, nq, 10, gb.data());
    tq::IndexConfig ic;
    ic.dim = static_cast<int>(d);
    tq::Index idx(ic);
    idx.add(n, x.data());
    index = dir.path("base.tqi");
    idx.save(index);
    auto ib = tq::read_file_bytes(index);
    ib[ib.size() / 2] ^= 0x40;
    corrupt_index = dir.path("corrupt.tqi");
    write(corrupt_index, ib.data(), ib.size());
    // IVF (version 2 file, 4 lists): whole, cut in half, one payload byte flipped, and the
    // version field set to 4 (checked before the header checksum).
    tq::IndexConfig ivc;
    ivc.dim = static_cast<int>(d);
    ivc.nlist = 4;
    tq::Index ivx(ivc);
    ivx.add(n, x.data());
    ivf_index = dir.path("ivf.tqi");
    ivx.save(ivf_index);
    const auto vb = tq::read_file_bytes(ivf_index);
    ivf_truncated = dir.path("ivf_truncated.tqi");
    write(ivf_truncated, vb.data(), vb.size() / 2);
    auto vc = vb;
    vc[vc.size() - 20] ^= 0x10;
    ivf_corrupt = dir.path("ivf_corrupt.tqi");
    write(ivf_corrupt, vc.data(), vc.size());
    auto v6 = vb;
    v6[8] = 6;
    ivf_version6 = dir.path("ivf_version6.tqi");
    write(ivf_version6, v6.data(), v6.size());
    // Centroid 1, component 2 (bytes 144 + 4 * (d + 2)) set to NaN and to 2.88e38 (finite, but
    // above the 2^64 a search keeps finite), checksums valid.
    for (const uint32_t bits : {0x7fc00000u, 0x7f58a8c0u}) {
      auto vn = vb;
      for (int i = 0; i < 4; ++i) vn[144 + 4 * (d + 2) + i] = static_cast<uint8_t>(bits >> (8 * i));
      const uint64_t npay = tq::checksum64(vn.data() + 128, vn.size() - 128);
      for (int i = 0; i < 8; ++i) vn[112 + i] = static_cast<uint8_t>(npay >> (8 * i));
      const uint64_t nhdr = tq::checksum64(vn.data(), 120);
      for (int i = 0; i < 8; ++i) vn[120 + i] = static_cast<uint8_t>(nhdr >> (8 * i));
      std::string& path = bits == 0x7fc00000u ? ivf_nan_centroid : ivf_huge_centroid;
      path = dir.path(bits == 0x7fc00000u ? "ivf_nan_centroid.tqi" : "ivf_huge_centroid.tqi");
      write(path, vn.data(), vn.size());
    }
    // IVF with an 8-bit refining second-stage code (version 4 file): whole, cut inside the
    // last record's second-stage code, a second-stage byte flipped, and the second stage's
    // width (the IVF section's last word, byte 140) set to 9 under valid checksums; and an
    // independent 8-bit code (version 3 file) with width 9 likewise.
    ivc.rerank_bits = 8;
    tq::Index ivr(ivc);
    ivr.add(n, x.data());
    ivf_rerank = dir.path("ivf_rerank.tqi");
    ivr.save(ivf_rerank);
    const auto rb = tq::read_file_bytes(ivf_rerank);
    uint64_t ids_offset = 0;
    for (int i = 0; i < 8; ++i) ids_offset |= static_cast<uint64_t>(rb[72 + i]) << (8 * i);
    ivf_rerank_truncated = dir.path("ivf_rerank_truncated.tqi");
    write(ivf_rerank_truncated, rb.data(), ids_offset - 3);
    auto rc = rb;
    rc[ids_offset - 3] ^= 0x10;
    ivf_rerank_corrupt = dir.path("ivf_rerank_corrupt.tqi");
    write(ivf_rerank_corrupt, rc.data(), rc.size());
    auto rw = rb;
    rw[140] = 9;
    const uint64_t pay = tq::checksum64(rw.data() + 128, rw.size() - 128);
    for (int i = 0; i < 8; ++i) rw[112 + i] = static_cast<uint8_t>(pay >> (8 * i));
    const uint64_t hdr = tq::checksum64(rw.data(), 120);
    for (int i = 0; i < 8; ++i) rw[120 + i] = static_cast<uint8_t>(hdr >> (8 * i));
    ivf_rerank_width = dir.path("ivf_rerank_width.tqi");
    write(ivf_rerank_width, rw.data(), rw.size());
    ivc.rerank_refine = false;
    tq::Index ivi(ivc);
    ivi.add(n, x.data());
    ivf_indep_width = dir.path("ivf_indep_width.tqi");
    ivi.save(ivf_indep_width);
    auto iw = tq::read_file_bytes(ivf_indep_width);
    iw[140] = 9;
    const uint64_t ipay = tq::checksum64(iw.data() + 128, iw.size() - 128);
    for (int i = 0; i < 8; ++i) iw[112 + i] = static_cast<uint8_t>(ipay >> (8 * i));
    const uint64_t ihdr = tq::checksum64(iw.data(), 120);
    for (int i = 0; i < 8; ++i) iw[120 + i] = static_cast<uint8_t>(ihdr >> (8 * i));
    write(ivf_indep_width, iw.data(), iw.size());
    auto fb = tq::read_file_bytes(base);
    truncated_fvecs = dir.path("truncated.fvecs");
    write(truncated_fvecs, fb.data(), fb.size() - 3);
    fb[4 + 3 * 4] = 0x00;  // component 3 of vector 0 := NaN
    fb[4 + 3 * 4 + 1] = 0x00;
    fb[4 + 3 * 4 + 2] = 0xc0;
    fb[4 + 3 * 4 + 3] = 0x7f;
    nan_fvecs = dir.path("nan.fvecs");
    write(nan_fvecs, fb.data(), fb.size());
    const float huge = 1e30f;  // component 3 of vector 0 := 1e30: finite, but no score of it is
    std::memcpy(fb.data() + 4 + 3 * 4, &huge, 4);
    huge_fvecs = dir.path("huge.fvecs");
    write(huge_fvecs, fb.data(), fb.size());
  }
  // Without model_id unless one is given (as files of earlier builds).
  void write_sens(const std::string& name, int ctx, int n_layers, const std::string& k_type, const std::string& model_file,
                  const nlohmann::json& model_id = nullptr) {
    const size_t n = static_cast<size_t>(n_layers) * 2;  // 2 KV heads of 16 dims, as the fixture model
    nlohmann::json j = {{"format", "tq-calibrate-sensitivity-1"}, {"model", model_file}, {"file", "text.txt"},
                              {"n_layers", n_layers}, {"n_kv_heads", 2}, {"head_dim", 16}, {"ctx", ctx},
                              {"windows", 1}, {"windows_requested", 1}, {"scored_tokens", ctx / 2 - 1},
                              {"probe_k", "tq4n8"}, {"probe_v", "tq4n8"}, {"protect", "ks"}, {"ppl_f16", 100.0},
                              {"seconds", 1.0}, {"sens_k", std::vector<double>(n, 0.01)},
                              {"sens_v", std::vector<double>(n, 0.01)},
                              {"types_k", {{{"type", k_type}, {"kld", 0.1}}}},
                              {"types_v", {{{"type", "tq4n8"}, {"kld", 0.1}}}}};
    if (!model_id.is_null()) j["model_id"] = model_id;
    write(dir.path(name), j.dump(1));
  }
  static void write(const std::string& p, const std::string& text) { write(p, text.data(), text.size()); }
  static void write(const std::string& p, const void* data, size_t n) {
    FILE* f = std::fopen(p.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    if (n) std::fwrite(data, 1, n, f);
    std::fclose(f);
  }
};

// `tq perplexity --json` on the fixture model (one 64-token window, 1 thread) with `extra`
// flags: its JSON, or {} after a failure (reported).
nlohmann::json fixture_perplexity(const Fixtures& fx, const std::vector<std::string>& extra) {
  std::vector<std::string> a = {"perplexity", "-m", fx.model, "-f", fx.text, "-t", "1", "-c", "64", "--chunks", "1", "--json"};
  a.insert(a.end(), extra.begin(), extra.end());
  const RunResult r = run_tq(a);
  EXPECT_EQ(r.status, 0) << r.err;
  return nlohmann::json::parse(r.status == 0 && !r.out.empty() ? r.out : "{}");
}

}  // namespace

// The fixture model itself works (so the failures below are about the bad input only).
TEST(CliBadInput, FixtureModelLoads) {
  Fixtures fx;
  const RunResult r = run_tq({"tokenize", "-m", fx.model, "-p", "hello", "--ids"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
}

// calibrate --sens A --long-ctx L -f TEXT: measuring only L for saved sensitivities gives what
// one run measuring -c and L gives (the same long-context sensitivities, the same allocation).
TEST(CliBadInput, CalibrateSensWithLongCtxEqualsOneRun) {
  Fixtures fx;
  const std::vector<std::string> base = {"calibrate", "-m", fx.model, "-f", fx.text, "-t", "1", "--bits", "6",
                                         "-c", "32", "--chunks", "1", "--probe-k", "tq4n8", "--probe-v", "tq4n8",
                                         "--long-probes", "growing", "--json"};
  auto with = [&](std::vector<std::string> extra, bool measure_c) {
    std::vector<std::string> a = base;
    if (!measure_c) {  // no --chunks / --probe-k / --probe-v with --sens and --long-ctx: the file's
      a.erase(a.begin() + 11, a.begin() + 17);
    }
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const RunResult one = run_tq(with({"--long-ctx", "64", "--save-sens", fx.dir.path("one.json"), "-o",
                                     fx.dir.path("one.kv")}, true));
  ASSERT_EQ(one.status, 0) << one.err;
  // The -c measurement alone, then the long context for it.
  std::vector<std::string> short_only = {"calibrate", "-m", fx.model, "-f", fx.text, "-t", "1", "--bits", "6", "-c", "32",
                                         "--chunks", "1", "--probe-k", "tq4n8", "--probe-v", "tq4n8", "--save-sens",
                                         fx.dir.path("short.json"), "-o", fx.dir.path("short.kv")};
  const RunResult sh = run_tq(short_only);
  ASSERT_EQ(sh.status, 0) << sh.err;
  const RunResult two = run_tq(with({"--sens", fx.dir.path("short.json"), "--long-ctx", "64", "--save-sens",
                                     fx.dir.path("two.json"), "-o", fx.dir.path("two.kv")}, false));
  ASSERT_EQ(two.status, 0) << two.err;
  const auto j1 = nlohmann::json::parse(one.out), j2 = nlohmann::json::parse(two.out);
  EXPECT_EQ(j1["label"], j2["label"]);
  ASSERT_EQ(j2["contexts"].size(), 2u);
  EXPECT_EQ(j2["contexts"][1]["ctx"], 64);
  EXPECT_GT(j2["seconds_measure"].get<double>(), 0.0);
  auto sens_of = [](const std::string& path) {
    std::ifstream f(path);
    return nlohmann::json::parse(f);
  };
  EXPECT_FALSE(fs::exists(fx.dir.path("two.json")));  // only what this run measured is saved: NAME.c64.json
  const auto l1 = sens_of(fx.dir.path("one.c64.json")), l2 = sens_of(fx.dir.path("two.c64.json"));
  for (const char* key : {"sens_k", "sens_v", "types_k", "types_v", "ppl_f16", "ctx", "scored_tokens"})
    EXPECT_EQ(l1[key], l2[key]) << key;
  EXPECT_EQ(l2["file"], fx.text);
  // The two-step file's header names both steps' texts: the measured one and the loaded one.
  std::ifstream kv(fx.dir.path("two.kv"));
  const std::string head((std::istreambuf_iterator<char>(kv)), std::istreambuf_iterator<char>());
  EXPECT_NE(head.find("ctx 64: 1 window"), std::string::npos) << head;
}

// perplexity --kld-buckets: the buckets cover the scored positions, and their means, weighted
// by their sizes, give kld_mean.

// --save-sens records the model's identity (model_id: architecture, shape, file size, a hash of
// the tensors); --sens checks it against -m whenever given: the same model loads, also renamed;
// a model of the same name and shape with other weights is refused, naming both. Files without
// model_id (earlier builds) load as before: no check when only allocating.
TEST(CliBadInput, CalibrateSensChecksTheModelId) {
  Fixtures fx;
  const std::string saved = fx.dir.path("saved.json");
  const RunResult m = run_tq({"calibrate", "-m", fx.model, "-f", fx.text, "-t", "1", "--bits", "6", "-c", "32",
                              "--chunks", "1", "--probe-k", "tq4n8", "--probe-v", "tq4n8", "--save-sens", saved, "-o",
                              fx.dir.path("m.kv")});
  ASSERT_EQ(m.status, 0) << m.err;
  nlohmann::json j = nlohmann::json::parse(tq_test::slurp_text(saved));
  ASSERT_TRUE(j.contains("model_id")) << j.dump();
  EXPECT_EQ(j["model_id"]["arch"], "llama");
  EXPECT_EQ(j["model_id"]["n_layers"], 2);
  EXPECT_EQ(j["model_id"]["file_bytes"], std::filesystem::file_size(fx.model));
  EXPECT_EQ(j["model_id"]["tensors_xxh3"].get<std::string>().size(), 16u);
  // Renamed: the same model.
  const std::string renamed = fx.dir.path("renamed.gguf");
  std::filesystem::copy_file(fx.model, renamed);
  // Same name, shape and tokenizer, other weights.
  const std::string other_dir = fx.dir.path("other");
  std::filesystem::create_directory(other_dir);
  const std::string other = other_dir + "/tiny.gguf";
  Fixtures::tiny_model(8).write(other);
  ASSERT_EQ(std::filesystem::file_size(other), std::filesystem::file_size(fx.model));
  auto alloc = [&](const std::string& model, const std::string& sens) {
    return run_tq({"calibrate", "-m", model, "--bits", "6", "--sens", sens, "-o", fx.dir.path("a.kv")});
  };
  for (const std::string& model : {fx.model, renamed}) {
    const RunResult r = alloc(model, saved);
    EXPECT_EQ(r.status, 0) << model << ": " << r.err;
  }
  const RunResult bad = alloc(other, saved);
  EXPECT_TRUE(tq_test::failed_cleanly(bad)) << bad.err;
  EXPECT_NE(bad.err.find("was measured on another model: '" + fx.model + "'"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("not '" + other + "'"), std::string::npos) << bad.err;
  // The same file without model_id, as earlier builds wrote it: loads, with any model of the shape.
  j.erase("model_id");
  const std::string legacy = fx.dir.path("legacy.json");
  Fixtures::write(legacy, j.dump(1));
  for (const std::string& model : {fx.model, other}) {
    const RunResult r = alloc(model, legacy);
    EXPECT_EQ(r.status, 0) << model << ": " << r.err;
  }
}
TEST(CliBadInput, PerplexityKldBuckets) {
  Fixtures fx;
  const auto j = fixture_perplexity(fx, {"--compare", "f16", "-ctk", "tq3", "--kld-buckets", "3"});
  ASSERT_TRUE(j.contains("kld_by_position")) << j.dump();
  const auto& b = j["kld_by_position"];
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0]["from"], 32);
  EXPECT_EQ(b[2]["to"], 63);  // rows 32 .. 62 predict tokens 33 .. 63
  double sum = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (i > 0) EXPECT_EQ(b[i]["from"], b[i - 1]["to"]);
    sum += b[i]["kld_mean"].get<double>() * (b[i]["to"].get<int>() - b[i]["from"].get<int>());
  }
  EXPECT_GT(j["kld_mean"].get<double>(), 0.0);
  EXPECT_NEAR(sum / 31.0, j["kld_mean"].get<double>(), 1e-9 + 1e-9 * j["kld_mean"].get<double>());
}

// Progress when stderr is not a terminal (here a file, TQ_PROGRESS unset): plain lines with
// elapsed time and ETA, the last one "100% ... done", for perplexity and for each calibrate
// pass (the -c pass and the --long-ctx one); no carriage returns. TQ_PROGRESS=0: nothing;
// TQ_PROGRESS=1: the bar (redrawn with \r).
TEST(CliBadInput, ProgressLinesWhenStderrIsNotATerminal) {
  Fixtures fx;
  const std::vector<std::string> ppl = {"perplexity", "-m", fx.model, "-f", fx.text, "-t", "1", "-c", "64",
                                        "--chunks", "1", "--json"};
  const std::vector<std::string> cal = {"calibrate", "-m", fx.model, "-f", fx.text, "-t", "1", "--bits", "6",
                                        "-c", "32", "--chunks", "1", "--probe-k", "tq4n8", "--probe-v", "tq4n8",
                                        "--long-ctx", "64", "--long-probes", "growing", "-o", fx.dir.path("p.kv")};
  const std::vector<std::string> ivf = {"index", "build", "-i", fx.base, "-o", fx.dir.path("ivf_progress.tqi"),
                                        "--ivf", "4", "-t", "2"};
  const std::regex line(R"(^([a-z0-9 -]+): (\d+)% \((\d+)/(\d+)\), [0-9.hms]+ elapsed, (ETA [0-9.hms?]+|done)$)");
  auto labels_done = [&](const std::string& err) {
    std::vector<std::string> done;  // labels whose last line is 100%, in order
    std::string last_label;
    std::istringstream in(err);
    for (std::string l; std::getline(in, l);) {
      std::smatch m;
      if (!std::regex_match(l, m, line)) continue;
      const bool full = m[3] == m[4];
      EXPECT_EQ(full, m[2] == "100") << l;
      EXPECT_EQ(full, m[5] == "done") << l;
      if (full) done.push_back(m[1]);
    }
    return done;
  };
  for (const auto& [args, want] :
       {std::pair{ppl, std::vector<std::string>{"perplexity"}},
        std::pair{cal, std::vector<std::string>{"calibrate", "calibrate c64"}},
        std::pair{ivf, std::vector<std::string>{"index k-means", "index assign", "index encode"}}}) {
    const RunResult r = run_tq(args, "", nullptr);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
    EXPECT_EQ(labels_done(r.err), want) << r.err;
    const RunResult off = run_tq(args, "", "0");
    ASSERT_EQ(off.status, 0) << off.err;
    EXPECT_TRUE(labels_done(off.err).empty()) << off.err;
    const RunResult bar = run_tq(args, "", "1");
    ASSERT_EQ(bar.status, 0) << bar.err;
    EXPECT_NE(bar.err.find('\r'), std::string::npos) << bar.err;
  }
}

// bench model: an entry with a space is a whole sweep label, echoed in the JSON rows.
TEST(CliBadInput, BenchModelTakesLabels) {
  Fixtures fx;
  const RunResult r = run_tq({"bench", "model", "-m", fx.model, "-f", fx.text, "-t", "1", "--contexts", "64",
                              "--decode", "2", "--caches", "f16,tq3/tq4 s1 ck ks", "--kv-window", "8", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\"kv\": \"k=tq3 v=tq4 sink=1 center=k scale-k\""), std::string::npos) << r.out;  // no w8: label's own flags
  EXPECT_NE(r.out.find("\"kv\": \"k=f16 v=f16 window=8\""), std::string::npos) << r.out;
}

// bench model's JSON keeps each repetition's tok/s (the row's figure is their median, the
// ratios medians over medians) and the 1-minute load average at the start and the end.
TEST(CliBadInput, BenchModelKeepsEachRepAndTheLoad) {
  Fixtures fx;
  const RunResult r = run_tq({"bench", "model", "-m", fx.model, "-f", fx.text, "-t", "1", "--contexts", "32",
                              "--decode", "2", "--caches", "f16,tq4", "--reps", "3", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* when : {"start", "end"}) EXPECT_GE(j["load_average_1min"][when].get<double>(), 0.0) << r.out;
  ASSERT_EQ(j["rows"].size(), 2u) << r.out;
  double first[2] = {0, 0};
  for (size_t i = 0; i < 2; ++i) {
    const auto& row = j["rows"][i];
    const char* keys[2][2] = {{"prefill_tok_s_each", "prefill_tok_s"}, {"decode_tok_s_each", "decode_tok_s"}};
    for (int k = 0; k < 2; ++k) {
      std::vector<double> v = row[keys[k][0]].get<std::vector<double>>();
      ASSERT_EQ(v.size(), 3u) << r.out;
      std::sort(v.begin(), v.end());
      EXPECT_GT(v[0], 0.0) << r.out;
      EXPECT_EQ(row[keys[k][1]].get<double>(), v[1]) << r.out;
      if (i == 0) first[k] = v[1];
    }
    EXPECT_DOUBLE_EQ(row["prefill_vs_first"].get<double>(), row["prefill_tok_s"].get<double>() / first[0]);
    EXPECT_DOUBLE_EQ(row["decode_vs_first"].get<double>(), row["decode_tok_s"].get<double>() / first[1]);
  }
}

// bench model's prompt starts with the BOS exactly when the model asks for one (add_bos), as
// the prompts of perplexity and generate do: "prompt_bos" in the JSON, and the tokenizer's
// first id agrees.
TEST(CliBadInput, BenchModelPromptHasTheModelsBos) {
  Fixtures fx;
  tq::GgufWriter w = Fixtures::tiny_model(7);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  const std::string with_bos = fx.dir.path("bos.gguf");
  w.write(with_bos);
  for (const std::string& model : {fx.model, with_bos}) {
    const RunResult tk = run_tq({"tokenize", "-m", model, "-p", "hello", "--ids", "--json"});
    ASSERT_EQ(tk.status, 0) << tk.err;
    const auto tj = nlohmann::json::parse(tk.out);
    const bool wants = model == with_bos;
    ASSERT_TRUE(tj.contains("ids")) << tk.out;
    EXPECT_EQ(tj["ids"][0] == 1, wants) << tk.out;  // BOS id 1 in the fixture
    const RunResult r = run_tq({"bench", "model", "-m", model, "-f", fx.text, "-t", "1", "--contexts", "32",
                                "--decode", "1", "--caches", "f16", "--json"});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["prompt_bos"], wants) << r.out;
  }
}


// Every model command's JSON, and index build / eval's, names OpenBLAS's kernel set (float
// summation, so a result's last digits, and GEMM speed depend on it): a user's
// OPENBLAS_CORETYPE is kept as given; without one, tq never runs OpenBLAS's SSE3 Prescott
// fallback on a CPU with AVX2 (the launcher asks for SkylakeX or Haswell; src/common/blas_core.h).
// The random-weight model's niah answer is not valid UTF-8 (byte 0xAC first): the JSON must
// still parse (bad bytes become U+FFFD; this used to fail the command).
TEST(CliBadInput, JsonNamesBlasKernels) {
  Fixtures fx;
  const std::vector<std::vector<std::string>> cmds = {
      {"generate", "-m", fx.model, "-p", "hi", "-n", "2", "-t", "1", "--json"},
      {"perplexity", "-m", fx.model, "-f", fx.text, "-c", "64", "--chunks", "1", "-t", "1", "--json"},
      {"niah", "-m", fx.model, "-f", fx.text, "-c", "256", "--trials", "1", "--depths", "0.5", "-t", "1", "--json"},
      {"bench", "model", "-m", fx.model, "-f", fx.text, "--contexts", "64", "--decode", "2", "-t", "1", "--json"},
      {"index", "build", "-i", fx.base, "-o", fx.dir.path("blas.tqi"), "--ivf", "4", "-t", "1", "--json"},
      {"index", "eval", "--base", fx.base, "--queries", fx.queries, "--gt", fx.gt, "-k", "5", "-t", "1", "--json"},
  };
  const char* forced = tq_test::user_blas_core();
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  for (const auto& a : cmds) {
    const RunResult r = run_tq(a);
    ASSERT_EQ(r.status, 0) << a[0] << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_TRUE(j.contains("blas_core") && j["blas_core"].is_string()) << a[0] << ": " << r.out;
    const std::string core = j["blas_core"];
    EXPECT_FALSE(core.empty()) << a[0];
    if (forced) EXPECT_EQ(strcasecmp(core.c_str(), forced), 0) << a[0] << ": " << core << " vs " << forced;
    else if (avx2) EXPECT_NE(strcasecmp(core.c_str(), "Prescott"), 0) << a[0] << " " << a[1];
  }
}

// A cache config file (--kv-config, or @FILE in --sweep / --caches) runs the same cache as the
// flags it spells out; flags beside it override it; ';' separates --caches entries with commas.
TEST(CliBadInput, KvConfigFile) {
  Fixtures fx;
  const std::string cfg = fx.dir.path("alloc.kv");
  Fixtures::write(cfg, "# per-head types for the tiny model\ntq3/tq4\nL0.1:tq4/tq3   # one head\nL1:f16\n");
  auto run = [&](const std::vector<std::string>& extra) { return fixture_perplexity(fx, extra); };
  const auto from_file = run({"--kv-config", cfg});
  const auto from_flags = run({"-ctk", "tq3", "-ctv", "tq4", "--kv-layer-type", "0.1:tq4/tq3", "--kv-layer-type", "1:f16"});
  ASSERT_TRUE(from_file.contains("ppl") && from_flags.contains("ppl"));
  EXPECT_EQ(from_file["kv"]["label"], "k=tq3 v=tq4 sink=1 center=k,rope,512 layers=0.1:tq4/tq3 layers=1:f16");
  EXPECT_EQ(from_file["kv"]["label"], from_flags["kv"]["label"]);
  EXPECT_EQ(from_file["ppl"].get<double>(), from_flags["ppl"].get<double>());
  const auto overridden = run({"--kv-config", cfg, "-ctv", "tq2", "--kv-sink", "2"});
  EXPECT_EQ(overridden["kv"]["label"], "k=tq3 v=tq2 sink=2 layers=0.1:tq4/tq3 layers=1:f16");
  const auto sweep = run({"--sweep", "f16;@" + cfg});
  ASSERT_EQ(sweep["results"].size(), 2u);
  EXPECT_EQ(sweep["results"][1]["ppl"].get<double>(), from_file["ppl"].get<double>());
  auto bench = [&](const std::string& caches) {
    const RunResult r = run_tq({"bench", "model", "-m", fx.model, "-f", fx.text, "-t", "1", "--contexts", "64",
                                "--decode", "2", "--caches", caches, "--json"});
    EXPECT_EQ(r.status, 0) << r.err;
    std::vector<std::string> kvs;
    const nlohmann::json j = r.status == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
    if (j.contains("rows"))
      for (const auto& row : j["rows"]) kvs.push_back(row["kv"]);
    return kvs;
  };
  EXPECT_EQ(bench("f16,@" + cfg), (std::vector<std::string>{"k=f16 v=f16", "k=tq3 v=tq4 sink=1 center=k,rope,512 layers=0.1:tq4/tq3 layers=1:f16"}));
  EXPECT_EQ(bench("f16; tq3/tq4 L0,1:tq4 ;"), (std::vector<std::string>{"k=f16 v=f16", "k=tq3 v=tq4 sink=1 center=k,rope,512 layers=0,1:tq4"}));
  // `auto` alone in --caches means the model's recommended types (it once ran f16 silently):
  // on this head_dim-16 model they cannot run, which is a clear error naming them.
  const RunResult a = run_tq({"bench", "model", "-m", fx.model, "-f", fx.text, "-t", "1", "--contexts", "64",
                              "--decode", "2", "--caches", "f16;auto", "--json"});
  EXPECT_EQ(a.status, 1) << a.out;
  EXPECT_NE(a.err.find("tq3h6: head_dim 16 not supported"), std::string::npos) << a.err;
}

// --kv-trellis (label tc): the flag and the label token run the same cache, shown in the label
// and the JSON, and a different one from the scalar codes (same bytes).
TEST(CliBadInput, KvTrellisFlagAndLabel) {
  Fixtures fx;
  auto run = [&](const std::vector<std::string>& extra) { return fixture_perplexity(fx, extra); };
  const auto flag = run({"-ctk", "tq2", "-ctv", "tq3", "--kv-trellis"});
  ASSERT_TRUE(flag.contains("ppl")) << flag.dump();
  EXPECT_EQ(flag["kv"]["label"], "k=tq2 v=tq3 sink=1 center=k,rope,512 trellis");
  EXPECT_TRUE(flag["kv"]["trellis"].get<bool>());
  const auto label = run({"--sweep", "tq2/tq3 tc;tq2/tq3"});
  ASSERT_EQ(label["results"].size(), 2u);
  EXPECT_EQ(label["results"][0]["ppl"].get<double>(), flag["ppl"].get<double>());
  EXPECT_FALSE(label["results"][1]["kv"]["trellis"].get<bool>());
  EXPECT_NE(label["results"][1]["ppl"].get<double>(), flag["ppl"].get<double>());
  EXPECT_EQ(label["results"][1]["kv_bytes_per_token"], flag["kv_bytes_per_token"]);
}

// A tq K type without sink / centring flags runs protected (1 sink, 512-token K means) and says
// so in its label; --kv-plain (or the label token) runs the bare format; the two differ.
TEST(CliBadInput, TqKeysProtectedByDefault) {
  Fixtures fx;
  auto run = [&](const std::vector<std::string>& extra) { return fixture_perplexity(fx, extra); };
  const auto prot = run({"-ctk", "tq3", "-ctv", "tq3"});
  EXPECT_EQ(prot["kv"]["label"], "k=tq3 v=tq3 sink=1 center=k,rope,512");
  EXPECT_TRUE(prot["kv"]["auto_protected"].get<bool>());
  EXPECT_EQ(prot["kv"]["sink"], 1);
  const auto plain = run({"-ctk", "tq3", "-ctv", "tq3", "--kv-plain"});
  EXPECT_EQ(plain["kv"]["label"], "k=tq3 v=tq3 plain");
  EXPECT_EQ(plain["kv"]["sink"], 0);
  EXPECT_NE(plain["ppl"].get<double>(), prot["ppl"].get<double>());
  const auto given = run({"-ctk", "tq3", "-ctv", "tq3", "--kv-sink", "2"});  // one option given: no others added
  EXPECT_EQ(given["kv"]["label"], "k=tq3 v=tq3 sink=2");
  const auto sweep = run({"--sweep", "tq3 plain;tq3;f16/tq3"});
  ASSERT_TRUE(sweep.contains("results")) << sweep.dump();
  ASSERT_EQ(sweep["results"].size(), 3u);
  EXPECT_EQ(sweep["results"][0]["kv"]["label"], "k=tq3 v=tq3 plain");
  EXPECT_EQ(sweep["results"][0]["ppl"].get<double>(), plain["ppl"].get<double>());
  EXPECT_EQ(sweep["results"][1]["kv"]["label"], "k=tq3 v=tq3 sink=1 center=k,rope,512");
  EXPECT_EQ(sweep["results"][1]["ppl"].get<double>(), prot["ppl"].get<double>());
  EXPECT_EQ(sweep["results"][2]["kv"]["label"], "k=f16 v=tq3");  // K not tq: as given
  const auto swept_plain = run({"--sweep", "tq3;tq3 s1 ck", "--kv-plain"});  // global flag: unset entries only
  EXPECT_EQ(swept_plain["results"][0]["kv"]["label"], "k=tq3 v=tq3 plain");
  EXPECT_EQ(swept_plain["results"][1]["kv"]["label"], "k=tq3 v=tq3 sink=1 center=k");
  // The protection's K means rotate with RoPE; spelled out, the same cache; without cr, another
  EXPECT_TRUE(prot["kv"]["center_rope"].get<bool>());
  const auto cr = run({"-ctk", "tq3", "-ctv", "tq3", "--kv-sink", "1", "--kv-center", "k", "--kv-center-segment", "512",
                       "--kv-center-rope"});
  EXPECT_EQ(cr["kv"]["label"], "k=tq3 v=tq3 sink=1 center=k,rope,512");
  EXPECT_EQ(cr["ppl"].get<double>(), prot["ppl"].get<double>());
  const auto no_cr = run({"--sweep", "tq3 s1 ck cs512"});
  EXPECT_EQ(no_cr["results"][0]["kv"]["label"], "k=tq3 v=tq3 sink=1 center=k,512");
  EXPECT_FALSE(no_cr["results"][0]["kv"]["center_rope"].get<bool>());
  EXPECT_NE(no_cr["results"][0]["ppl"].get<double>(), prot["ppl"].get<double>());
}
TEST(CliBadInput, ModelCommands) {
  Fixtures fx;
  // Cache config files the cases name.
  Fixtures::write(fx.dir.path("comments.kv"), "# nothing but a comment\n");
  Fixtures::write(fx.dir.path("bad.kv"), "tq3/tq4\nL0.1:tq4 zz\n");
  // Files saved before a type or option was removed: each fails with what to use instead.
  Fixtures::write(fx.dir.path("old_qjl.kv"), "# QJL K\ntq4p/tq4 s1 ck\n");
  Fixtures::write(fx.dir.path("old_ck.kv"), "tq3/tq3n8 s1 ck:64\n");
  run_cases("ModelCommands", &fx.dir);
}

TEST(CliBadInput, IndexCommands) {
  Fixtures fx;
  run_cases("IndexCommands", &fx.dir);
}

TEST(CliBadInput, BenchAttention) {
  run_cases("BenchAttention");
}

// Regression tests for bugs these tests found:
//  - src/llm/eval.cpp read_text_file(): a directory opened as an empty stream, so
//    `tq perplexity -f <dir>` said "the text has 0 tokens" instead of naming the directory.
TEST(CliBadInput, PerplexityTextFileIsDirectory) {
  Fixtures fx;
  run_cases("PerplexityTextFileIsDirectory", &fx.dir);
}
//  - tools/tq/cmd_bench_attention.cpp: --threads was split and parsed with std::stoi, unchecked:
//    "1,two" printed "tq: error: stoi" and "-1" ran with -1 threads.
TEST(CliBadInput, BenchAttentionThreadList) {
  run_cases("BenchAttentionThreadList");
}

// The case file: every case complete, run by a TEST of this file (its group), and listed once.
TEST(CliBadInput, CaseFileIsWellFormed) {
  ASSERT_TRUE(case_file().is_object() && case_file().contains("cases") && case_file()["cases"].is_array())
      << "cannot read " << kCaseFile;
  const std::set<std::string> groups = {"EveryCommandRejectsUnknownOptions", "Codebook", "Distortion",
                                        "DistortionNegativeSeed", "BenchCodec", "ModelCommands", "IndexCommands",
                                        "BenchAttention", "PerplexityTextFileIsDirectory", "BenchAttentionThreadList"};
  std::set<std::pair<std::string, std::vector<std::string>>> seen;
  for (const auto& c : case_file()["cases"]) {
    ASSERT_TRUE(c.is_object()) << c.dump();
    EXPECT_TRUE(c.contains("group") && c["group"].is_string() && groups.count(c["group"].get<std::string>()))
        << "no TEST runs this case: " << c.dump();
    for (const char* k : {"entry", "what", "error"}) EXPECT_TRUE(c.contains(k) && c[k].is_string()) << k << ": " << c.dump();
    EXPECT_TRUE(c.contains("exit") && c["exit"].is_number_integer() && c["exit"].get<int>() != 0) << c.dump();
    bool strings = c.contains("args") && c["args"].is_array() && c.contains("expect") && c["expect"].is_array();
    for (const char* k : {"args", "expect"})
      if (strings)
        for (const auto& x : c[k]) strings = strings && x.is_string();
    ASSERT_TRUE(strings) << "args and expect are lists of strings: " << c.dump();
    EXPECT_TRUE(seen.insert({c["group"].get<std::string>(), c["args"].get<std::vector<std::string>>()}).second)
        << "listed twice: " << c.dump();
  }
}
