// CliBadInput.*: runs the built `tq` binary (TQ_CLI_PATH) with bad input for every
// subcommand: missing / empty / directory-instead-of-file / truncated inputs, unknown type
// names, out-of-range and non-numeric numbers, unknown options. Each case must give a
// non-zero exit, exactly one line `tq: error: ...` on stderr that names the problem, nothing
// on stdout, and leave no output file (or temporary) behind.
//
// With TQ_BAD_INPUT_TABLE=<file> the cases and the errors they produced are written there
// as a Markdown table (RELIABILITY.md quotes it).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

// Rows for the optional Markdown table.
std::vector<std::string>& table_rows() {
  static std::vector<std::string> rows;
  return rows;
}
void write_table() {
  const char* path = std::getenv("TQ_BAD_INPUT_TABLE");
  if (!path || !*path) return;
  std::ofstream f(path);
  f << "| entry point | bad input | exit | error printed | contract met |\n|---|---|---|---|---|\n";
  for (auto& r : table_rows()) f << r << "\n";
}
struct TableWriter : ::testing::Environment {
  void TearDown() override { write_table(); }
};
[[maybe_unused]] auto* const g_table_env = ::testing::AddGlobalTestEnvironment(new TableWriter);

std::string md_escape(std::string s) {
  std::string o;
  for (char c : s) {
    if (c == '|') o += "\\|";
    else if (c == '\n') o += ' ';
    else o += c;
  }
  return o;
}

// Runs one bad-input case and checks the contract. `expect` are substrings (any one of
// them) that must appear in the error line: the thing that is wrong.
void expect_clean_error(const std::string& entry, const std::string& what, const std::vector<std::string>& args,
                        const std::vector<std::string>& expect, const TempDir* dir = nullptr) {
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
  const bool clean_dir = !dir || dir->listing() == before;
  if (dir) EXPECT_TRUE(clean_dir) << "files left behind";
  std::string verdict = "yes";
  if (r.status == 0) verdict = "NO: exit 0";
  else if (r.status >= 128) verdict = "NO: signal";
  else if (!r.out.empty()) verdict = "NO: stdout";
  else if (!one_line) verdict = "NO: not one error line";
  else if (!named) verdict = "NO: does not name it";
  else if (!clean_dir) verdict = "NO: file left";
  std::string line = r.err.substr(0, r.err.find('\n'));
  if (dir) {  // print paths relative to the temp dir
    const std::string d = dir->dir.string() + "/";
    for (size_t p; (p = line.find(d)) != std::string::npos;) line.replace(p, d.size(), "$TMP/");
  }
  std::string a = join(args);
  if (dir) {
    const std::string d = dir->dir.string() + "/";
    for (size_t p; (p = a.find(d)) != std::string::npos;) a.replace(p, d.size(), "$TMP/");
  }
  table_rows().push_back("| " + md_escape(entry) + " | " + md_escape(what) + ": `tq " + md_escape(a) + "` | " +
                         std::to_string(r.status) + " | " + (line.empty() ? std::string("(none)") : "`" + md_escape(line) + "`") +
                         " | " + verdict + " |");
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
  // Commands with required options may report the missing one first: also a clean error.
  for (const auto& c : cmds) {
    expect_clean_error("tq " + join(c), "unknown option", with(c, {"--no-such-option"}),
                       {"--no-such-option", "is required"});
    expect_clean_error("tq " + join(c), "stray argument", with(c, {"stray-positional-arg"}),
                       {"stray-positional-arg", "is required"});
  }
  expect_clean_error("tq", "no subcommand", {}, {"subcommand"});
  expect_clean_error("tq", "unknown subcommand", {"no-such-command"}, {"no-such-command", "subcommand"});
  expect_clean_error("tq", "unknown SIMD level", {"--simd", "avx9000", "codebook"}, {"avx9000"});
}

TEST(CliBadInput, Codebook) {
  const std::string e = "tq codebook";
  expect_clean_error(e, "non-numeric dimension", {"codebook", "--dim", "abc"}, {"--dim"});
  expect_clean_error(e, "trailing junk in a number", {"codebook", "--dim", "12x"}, {"--dim"});
  expect_clean_error(e, "empty number", {"codebook", "--bits", ""}, {"--bits", "bits"});
  expect_clean_error(e, "dimension too small", {"codebook", "--dim", "1"}, {"dimension"});
  expect_clean_error(e, "negative dimension", {"codebook", "--dim", "-5"}, {"dimension", "--dim"});
  expect_clean_error(e, "dimension beyond int", {"codebook", "--dim", "99999999999"}, {"--dim"});
  expect_clean_error(e, "dimension too large", {"codebook", "--dim", "2000000000"}, {"dimension"});
  expect_clean_error(e, "bits 0", {"codebook", "--bits", "0"}, {"bits"});
  expect_clean_error(e, "bits 9", {"codebook", "--bits", "9"}, {"bits"});
  expect_clean_error(e, "non-numeric bits", {"codebook", "--bits", "four"}, {"--bits"});
  expect_clean_error(e, "unknown law", {"codebook", "--law", "cauchy"}, {"cauchy"});
  expect_clean_error(e, "missing option value", {"codebook", "--dim"}, {"--dim"});
}

TEST(CliBadInput, Distortion) {
  const std::string e = "tq distortion";
  expect_clean_error(e, "unknown rotation", {"distortion", "--rotation", "fourier"}, {"fourier"});
  expect_clean_error(e, "unknown quantizer", {"distortion", "--quantizer", "pq"}, {"'pq'"});
  expect_clean_error(e, "unknown law", {"distortion", "--law", "uniform"}, {"uniform"});
  expect_clean_error(e, "unknown norm format", {"distortion", "--norm", "f8"}, {"f8"});
  expect_clean_error(e, "zero vectors", {"distortion", "-n", "0"}, {"--n"});
  expect_clean_error(e, "negative count", {"distortion", "-n", "-1"}, {"--n"});
  expect_clean_error(e, "count above the limit", {"distortion", "-n", "100000000000"}, {"--n"});
  expect_clean_error(e, "non-numeric count", {"distortion", "-n", "many"}, {"--n"});
  expect_clean_error(e, "non-numeric seed", {"distortion", "--seed", "abc"}, {"--seed"});
  expect_clean_error(e, "dimension too large", {"distortion", "-d", "100000000"}, {"dimension"});
  expect_clean_error(e, "dimension too small", {"distortion", "-d", "1"}, {"dimension"});
  expect_clean_error(e, "prod with 1 bit", {"distortion", "-b", "1", "-q", "prod"}, {"bits"});
  expect_clean_error(e, "prod dimension above its limit", {"distortion", "-d", "20000", "-q", "prod"}, {"16384"});
  expect_clean_error(e, "bits 9", {"distortion", "-b", "9"}, {"bits"});
}

// `--seed -1` used to be accepted by CLI11 as 2^64 - 1 for a uint64_t option; regression test.
TEST(CliBadInput, DistortionNegativeSeed) {
  expect_clean_error("tq distortion", "negative seed", {"distortion", "--seed", "-1", "-n", "10"}, {"--seed"});
}

TEST(CliBadInput, BenchCodec) {
  const std::string e = "tq bench codec";
  expect_clean_error(e, "zero threads", {"bench", "codec", "--threads", "0"}, {"--threads"});
  expect_clean_error(e, "too many threads", {"bench", "codec", "--threads", "100000"}, {"--threads"});
  expect_clean_error(e, "non-numeric threads", {"bench", "codec", "--threads", "two"}, {"--threads"});
  expect_clean_error(e, "zero vectors", {"bench", "codec", "-n", "0"}, {"--n"});
  expect_clean_error(e, "zero reps", {"bench", "codec", "--reps", "0"}, {"--reps"});
  expect_clean_error(e, "unknown rotation", {"bench", "codec", "--rotation", "dct"}, {"dct"});
  expect_clean_error(e, "unknown quantizer", {"bench", "codec", "--quantizer", "opq"}, {"opq"});
  expect_clean_error(e, "dimension too small", {"bench", "codec", "-d", "1"}, {"dimension"});
  expect_clean_error(e, "bits 0", {"bench", "codec", "-b", "0", "-n", "10"}, {"bits"});
  expect_clean_error(e, "missing subcommand", {"bench"}, {"subcommand"});
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
      corrupt_index, truncated_fvecs, nan_fvecs;
  Fixtures() {
    tq_test::TinyLlama c;
    c.n_vocab = 3 + 256;
    tq::GgufWriter w = tq_test::tiny_llama_gguf(c, tq::GgmlType::F16, 7);
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
    auto fb = tq::read_file_bytes(base);
    truncated_fvecs = dir.path("truncated.fvecs");
    write(truncated_fvecs, fb.data(), fb.size() - 3);
    fb[4 + 3 * 4] = 0x00;  // component 3 of vector 0 := NaN
    fb[4 + 3 * 4 + 1] = 0x00;
    fb[4 + 3 * 4 + 2] = 0xc0;
    fb[4 + 3 * 4 + 3] = 0x7f;
    nan_fvecs = dir.path("nan.fvecs");
    write(nan_fvecs, fb.data(), fb.size());
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

// bench model: an entry with a space is a whole sweep label, echoed in the JSON rows.
TEST(CliBadInput, BenchModelTakesLabels) {
  Fixtures fx;
  const RunResult r = run_tq({"bench", "model", "-m", fx.model, "-f", fx.text, "-t", "1", "--contexts", "64",
                              "--decode", "2", "--caches", "f16,tq3/tq4 s1 ck ks", "--kv-window", "8", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\"kv\": \"tq3/tq4 s1 ck ks\""), std::string::npos) << r.out;  // no w8: label's own flags
  EXPECT_NE(r.out.find("\"kv\": \"f16 w8\""), std::string::npos) << r.out;
}


// Every model command's JSON names OpenBLAS's kernel set (float summation, so a result's last
// digits, and prefill speed depend on it): a user's OPENBLAS_CORETYPE is kept as given. The
// random-weight model's niah answer is not valid UTF-8 (byte 0xAC first): the JSON must
// still parse (bad bytes become U+FFFD; this used to fail the command).
TEST(CliBadInput, ModelJsonNamesBlasKernels) {
  Fixtures fx;
  const std::vector<std::vector<std::string>> cmds = {
      {"generate", "-m", fx.model, "-p", "hi", "-n", "2", "-t", "1", "--json"},
      {"perplexity", "-m", fx.model, "-f", fx.text, "-c", "64", "--chunks", "1", "-t", "1", "--json"},
      {"niah", "-m", fx.model, "-f", fx.text, "-c", "256", "--trials", "1", "--depths", "0.5", "-t", "1", "--json"},
      {"bench", "model", "-m", fx.model, "-f", fx.text, "--contexts", "64", "--decode", "2", "-t", "1", "--json"},
  };
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  for (const auto& a : cmds) {
    const RunResult r = run_tq(a);
    ASSERT_EQ(r.status, 0) << a[0] << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_TRUE(j.contains("blas_core") && j["blas_core"].is_string()) << a[0] << ": " << r.out;
    const std::string core = j["blas_core"];
    EXPECT_FALSE(core.empty()) << a[0];
    if (forced && *forced) EXPECT_EQ(strcasecmp(core.c_str(), forced), 0) << a[0] << ": " << core << " vs " << forced;
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
  EXPECT_EQ(from_file["kv"]["label"], "tq3/tq4 s1 ck cs512 cr L0.1:tq4/tq3 L1:f16");
  EXPECT_EQ(from_file["kv"]["label"], from_flags["kv"]["label"]);
  EXPECT_EQ(from_file["ppl"].get<double>(), from_flags["ppl"].get<double>());
  const auto overridden = run({"--kv-config", cfg, "-ctv", "tq2", "--kv-sink", "2"});
  EXPECT_EQ(overridden["kv"]["label"], "tq3/tq2 s2 L0.1:tq4/tq3 L1:f16");
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
  EXPECT_EQ(bench("f16,@" + cfg), (std::vector<std::string>{"f16", "tq3/tq4 s1 ck cs512 cr L0.1:tq4/tq3 L1:f16"}));
  EXPECT_EQ(bench("f16; tq3/tq4 L0,1:tq4 ;"), (std::vector<std::string>{"f16", "tq3/tq4 s1 ck cs512 cr L0,1:tq4"}));
}

// --kv-trellis (label tc): the flag and the label token run the same cache, shown in the label
// and the JSON, and a different one from the scalar codes (same bytes).
TEST(CliBadInput, KvTrellisFlagAndLabel) {
  Fixtures fx;
  auto run = [&](const std::vector<std::string>& extra) { return fixture_perplexity(fx, extra); };
  const auto flag = run({"-ctk", "tq2", "-ctv", "tq3", "--kv-trellis"});
  ASSERT_TRUE(flag.contains("ppl")) << flag.dump();
  EXPECT_EQ(flag["kv"]["label"], "tq2/tq3 s1 ck cs512 cr tc");
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
  EXPECT_EQ(prot["kv"]["label"], "tq3 s1 ck cs512 cr");
  EXPECT_TRUE(prot["kv"]["auto_protected"].get<bool>());
  EXPECT_EQ(prot["kv"]["sink"], 1);
  const auto plain = run({"-ctk", "tq3", "-ctv", "tq3", "--kv-plain"});
  EXPECT_EQ(plain["kv"]["label"], "tq3 plain");
  EXPECT_EQ(plain["kv"]["sink"], 0);
  EXPECT_NE(plain["ppl"].get<double>(), prot["ppl"].get<double>());
  const auto given = run({"-ctk", "tq3", "-ctv", "tq3", "--kv-sink", "2"});  // one option given: no others added
  EXPECT_EQ(given["kv"]["label"], "tq3 s2");
  const auto sweep = run({"--sweep", "tq3 plain;tq3;f16/tq3"});
  ASSERT_TRUE(sweep.contains("results")) << sweep.dump();
  ASSERT_EQ(sweep["results"].size(), 3u);
  EXPECT_EQ(sweep["results"][0]["kv"]["label"], "tq3 plain");
  EXPECT_EQ(sweep["results"][0]["ppl"].get<double>(), plain["ppl"].get<double>());
  EXPECT_EQ(sweep["results"][1]["kv"]["label"], "tq3 s1 ck cs512 cr");
  EXPECT_EQ(sweep["results"][1]["ppl"].get<double>(), prot["ppl"].get<double>());
  EXPECT_EQ(sweep["results"][2]["kv"]["label"], "f16/tq3");  // K not tq: as given
  const auto swept_plain = run({"--sweep", "tq3;tq3 s1 ck", "--kv-plain"});  // global flag: unset entries only
  EXPECT_EQ(swept_plain["results"][0]["kv"]["label"], "tq3 plain");
  EXPECT_EQ(swept_plain["results"][1]["kv"]["label"], "tq3 s1 ck");
  // The protection's K means rotate with RoPE; spelled out, the same cache; without cr, another
  EXPECT_TRUE(prot["kv"]["center_rope"].get<bool>());
  const auto cr = run({"-ctk", "tq3", "-ctv", "tq3", "--kv-sink", "1", "--kv-center", "k", "--kv-center-segment", "512",
                       "--kv-center-rope"});
  EXPECT_EQ(cr["kv"]["label"], "tq3 s1 ck cs512 cr");
  EXPECT_EQ(cr["ppl"].get<double>(), prot["ppl"].get<double>());
  const auto no_cr = run({"--sweep", "tq3 s1 ck cs512"});
  EXPECT_EQ(no_cr["results"][0]["kv"]["label"], "tq3 s1 ck cs512");
  EXPECT_FALSE(no_cr["results"][0]["kv"]["center_rope"].get<bool>());
  EXPECT_NE(no_cr["results"][0]["ppl"].get<double>(), prot["ppl"].get<double>());
}
TEST(CliBadInput, ModelCommands) {
  Fixtures fx;
  const std::string missing = fx.dir.path("no_such_model.gguf");
  struct Cmd {
    std::vector<std::string> args;  // without -m
  };
  const std::vector<Cmd> cmds = {
      {{"generate", "-p", "hi", "-n", "2"}},
      {{"perplexity", "-f", fx.text, "-c", "64", "--chunks", "1"}},
      {{"niah", "-f", fx.text, "-c", "128", "--trials", "1", "--depths", "0.5"}},
      {{"tokenize", "-p", "hi"}},
      {{"bench", "model", "-f", fx.text, "--contexts", "64", "--decode", "2"}},
  };
  for (const auto& c : cmds) {
    const std::string e = "tq " + c.args[0] + (c.args[0] == "bench" ? " model" : "");
    auto with_model = [&](const std::string& m) {
      std::vector<std::string> a = c.args;
      a.insert(a.begin() + (c.args[0] == "bench" ? 2 : 1), {"-m", m});
      return a;
    };
    expect_clean_error(e, "missing model file", with_model(missing), {"no_such_model.gguf"}, &fx.dir);
    expect_clean_error(e, "empty model file", with_model(fx.empty), {"empty.bin"}, &fx.dir);
    expect_clean_error(e, "directory as model", with_model(fx.folder), {"a_directory"}, &fx.dir);
    expect_clean_error(e, "truncated model", with_model(fx.truncated_model), {"truncated"}, &fx.dir);
    expect_clean_error(e, "vector file as model", with_model(fx.base), {"GGUF", "base.fvecs"}, &fx.dir);
  }
  // Cache types and numbers, with a model that loads.
  const std::string m = fx.model;
  expect_clean_error("tq perplexity", "unknown K cache type",
                     {"perplexity", "-m", m, "-f", fx.text, "-c", "64", "-ctk", "tq9"}, {"tq9"}, &fx.dir);
  expect_clean_error("tq perplexity", "unknown V cache type",
                     {"perplexity", "-m", m, "-f", fx.text, "-c", "64", "-ctv", "int4"}, {"int4"}, &fx.dir);
  expect_clean_error("tq generate", "unknown boundary cache type",
                     {"generate", "-m", m, "-p", "hi", "--kv-boundary-layers", "1", "--kv-boundary-type", "fp8"},
                     {"fp8"}, &fx.dir);
  expect_clean_error("tq perplexity", "per-layer type on a layer the model lacks",
                     {"perplexity", "-m", m, "-f", fx.text, "-c", "64", "--kv-layer-type", "999:tq4"},
                     {"999", "out of range"}, &fx.dir);
  expect_clean_error("tq niah", "unknown per-layer cache type",
                     {"niah", "-m", m, "-f", fx.text, "--context", "256", "--kv-layer-type", "0:fp8"}, {"fp8"},
                     &fx.dir);
  expect_clean_error("tq perplexity", "malformed per-layer spec",
                     {"perplexity", "-m", m, "-f", fx.text, "-c", "64", "--kv-layer-type", "tq4"},
                     {"LAYERS:K[/V]"}, &fx.dir);
  expect_clean_error("tq bench model", "malformed cache label",
                     {"bench", "model", "-m", m, "-f", fx.text, "--contexts", "64", "--caches", "f16,tq3 s1 zz"},
                     {"tq3 s1 zz", "zz"}, &fx.dir);
  expect_clean_error("tq perplexity", "negative sink (would read as 'not given')",
                     {"perplexity", "-m", m, "-f", fx.text, "-c", "64", "-ctk", "tq3", "--kv-sink", "-1"},
                     {"--kv-sink", ">= 0"}, &fx.dir);
  expect_clean_error("tq niah", "negative K mean segment",
                     {"niah", "-m", m, "-f", fx.text, "--context", "256", "-ctk", "tq3", "--kv-center-segment", "-256"},
                     {"--kv-center-segment", ">= 0"}, &fx.dir);
  expect_clean_error("tq perplexity", "RoPE-rotating K means without K centring",
                     {"perplexity", "-m", m, "-f", fx.text, "-c", "64", "-ctk", "tq3", "--kv-plain", "--kv-center-rope"},
                     {"--kv-center-rope", "centring"}, &fx.dir);
  expect_clean_error("tq perplexity", "cr label token without K centring",
                     {"perplexity", "-m", m, "-f", fx.text, "-c", "64", "--sweep", "tq3;tq3 s1 cv cr"},
                     {"--kv-center-rope", "centring"}, &fx.dir);
  expect_clean_error("tq perplexity", "unknown sweep token next to plain",
                     {"perplexity", "-m", m, "-f", fx.text, "-c", "64", "--sweep", "tq3 plain;tq3 plane"},
                     {"plane"}, &fx.dir);
  const std::string comments_only = fx.dir.path("comments.kv"), bad_label = fx.dir.path("bad.kv");
  Fixtures::write(comments_only, "# nothing but a comment\n");
  Fixtures::write(bad_label, "tq3/tq4\nL0.1:tq4 zz\n");
  expect_clean_error("tq perplexity", "missing cache config file",
                     {"perplexity", "-m", m, "-f", fx.text, "-c", "64", "--kv-config", fx.dir.path("no.kv")},
                     {"no.kv", "cache config"}, &fx.dir);
  expect_clean_error("tq generate", "cache config file without a label",
                     {"generate", "-m", m, "-p", "hi", "--kv-config", comments_only}, {"comments.kv", "no cache label"},
                     &fx.dir);
  expect_clean_error("tq niah", "malformed label in a cache config file",
                     {"niah", "-m", m, "-f", fx.text, "--context", "256", "--kv-config", bad_label}, {"bad.kv", "zz"},
                     &fx.dir);
  expect_clean_error("tq bench model", "malformed label in an @FILE cache entry",
                     {"bench", "model", "-m", m, "-f", fx.text, "--contexts", "64", "--caches", "f16,@" + bad_label},
                     {"bad.kv", "zz"}, &fx.dir);
  expect_clean_error("tq perplexity", "cache config of a bigger model (head out of range)",
                     {"perplexity", "-m", m, "-f", fx.text, "-c", "64", "--kv-config",
                      std::string(TQ_SOURCE_DIR) + "/configs/smollm2-135m-kv4.25.kv"},
                     {"out of range"}, &fx.dir);
  expect_clean_error("tq bench model", "empty cache list",
                     {"bench", "model", "-m", m, "-f", fx.text, "--contexts", "64", "--caches", " ; "},
                     {"--caches"}, &fx.dir);
  expect_clean_error("tq perplexity", "non-numeric context", {"perplexity", "-m", m, "-f", fx.text, "-c", "lots"},
                     {"--ctx-size", "-c"}, &fx.dir);
  expect_clean_error("tq perplexity", "zero context", {"perplexity", "-m", m, "-f", fx.text, "-c", "0"},
                     {"context", "ctx"}, &fx.dir);
  expect_clean_error("tq perplexity", "negative context", {"perplexity", "-m", m, "-f", fx.text, "-c", "-64"},
                     {"context", "ctx"}, &fx.dir);
  expect_clean_error("tq perplexity", "missing text file",
                     {"perplexity", "-m", m, "-f", fx.dir.path("no_such.txt"), "-c", "64"}, {"no_such.txt"}, &fx.dir);
  expect_clean_error("tq perplexity", "empty text file", {"perplexity", "-m", m, "-f", fx.empty, "-c", "64"},
                     {"empty.bin", "tokens", "empty"}, &fx.dir);
  expect_clean_error("tq generate", "non-numeric token count", {"generate", "-m", m, "-p", "hi", "-n", "few"},
                     {"--n-predict", "-n"}, &fx.dir);
  expect_clean_error("tq generate", "missing prompt", {"generate", "-m", m}, {"--prompt"}, &fx.dir);
  expect_clean_error("tq generate", "non-numeric temperature", {"generate", "-m", m, "-p", "hi", "--temp", "warm"},
                     {"--temp"}, &fx.dir);
  expect_clean_error("tq tokenize", "missing text file", {"tokenize", "-m", m, "-f", fx.dir.path("nope.txt")},
                     {"nope.txt"}, &fx.dir);
  expect_clean_error("tq niah", "non-numeric depth", {"niah", "-m", m, "-f", fx.text, "--depths", "middle"},
                     {"--depths"}, &fx.dir);
}

TEST(CliBadInput, IndexCommands) {
  Fixtures fx;
  const std::string out = fx.dir.path("out.tqi");
  const std::string missing = fx.dir.path("no_such.fvecs");
  // index build: bad inputs, bad parameters; never an output file (or temp) left behind.
  const std::string eb = "tq index build";
  expect_clean_error(eb, "missing input", {"index", "build", "-i", missing, "-o", out}, {"no_such.fvecs"}, &fx.dir);
  expect_clean_error(eb, "empty input", {"index", "build", "-i", fx.empty, "-o", out}, {"empty.bin"}, &fx.dir);
  expect_clean_error(eb, "directory as input", {"index", "build", "-i", fx.folder, "-o", out}, {"a_directory"},
                     &fx.dir);
  expect_clean_error(eb, "truncated .fvecs", {"index", "build", "-i", fx.truncated_fvecs, "-o", out},
                     {"truncated.fvecs"}, &fx.dir);
  expect_clean_error(eb, "NaN in the vectors", {"index", "build", "-i", fx.nan_fvecs, "-o", out}, {"NaN"}, &fx.dir);
  expect_clean_error(eb, "GGUF file as input", {"index", "build", "-i", fx.model, "-o", out}, {"tiny.gguf"},
                     &fx.dir);
  expect_clean_error(eb, "unknown metric", {"index", "build", "-i", fx.base, "-o", out, "-m", "hamming"},
                     {"hamming"}, &fx.dir);
  expect_clean_error(eb, "unknown codec", {"index", "build", "-i", fx.base, "-o", out, "--codec", "pq"}, {"pq"},
                     &fx.dir);
  expect_clean_error(eb, "unknown scale mode", {"index", "build", "-i", fx.base, "-o", out, "--scale", "max"},
                     {"max"}, &fx.dir);
  expect_clean_error(eb, "unknown rotation", {"index", "build", "-i", fx.base, "-o", out, "--rotation", "dct"},
                     {"dct"}, &fx.dir);
  expect_clean_error(eb, "unknown norm format", {"index", "build", "-i", fx.base, "-o", out, "--norm", "bf16"},
                     {"bf16"}, &fx.dir);
  expect_clean_error(eb, "bits 0", {"index", "build", "-i", fx.base, "-o", out, "-b", "0"}, {"bits"}, &fx.dir);
  expect_clean_error(eb, "bits 9", {"index", "build", "-i", fx.base, "-o", out, "-b", "9"}, {"bits"}, &fx.dir);
  expect_clean_error(eb, "bits 2.25", {"index", "build", "-i", fx.base, "-o", out, "-b", "2.25"}, {"bits"}, &fx.dir);
  expect_clean_error(eb, "bits NaN", {"index", "build", "-i", fx.base, "-o", out, "-b", "nan"}, {"bits"}, &fx.dir);
  expect_clean_error(eb, "non-numeric bits", {"index", "build", "-i", fx.base, "-o", out, "-b", "four"}, {"--bits"},
                     &fx.dir);
  expect_clean_error(eb, "negative thread count", {"index", "build", "-i", fx.base, "-o", out, "-t", "-2"},
                     {"--threads"}, &fx.dir);
  expect_clean_error(eb, "output in a missing directory",
                     {"index", "build", "-i", fx.base, "-o", fx.dir.path("no/such/dir/out.tqi")}, {"no/such/dir"},
                     &fx.dir);
  expect_clean_error(eb, "output is a directory", {"index", "build", "-i", fx.base, "-o", fx.folder},
                     {"a_directory"}, &fx.dir);
  // index search
  const std::string es = "tq index search";
  expect_clean_error(es, "missing index", {"index", "search", "--index", fx.dir.path("none.tqi"), "-q", fx.queries},
                     {"none.tqi"}, &fx.dir);
  expect_clean_error(es, "empty index", {"index", "search", "--index", fx.empty, "-q", fx.queries}, {"empty.bin"},
                     &fx.dir);
  expect_clean_error(es, "directory as index", {"index", "search", "--index", fx.folder, "-q", fx.queries},
                     {"a_directory"}, &fx.dir);
  expect_clean_error(es, "corrupted index", {"index", "search", "--index", fx.corrupt_index, "-q", fx.queries},
                     {"checksum"}, &fx.dir);
  expect_clean_error(es, "vector file as index", {"index", "search", "--index", fx.base, "-q", fx.queries},
                     {"magic", "tq index"}, &fx.dir);
  expect_clean_error(es, "queries of the wrong dimension",
                     {"index", "search", "--index", fx.index, "-q", fx.queries_d5}, {"dim", "5"}, &fx.dir);
  expect_clean_error(es, "missing queries", {"index", "search", "--index", fx.index, "-q", missing},
                     {"no_such.fvecs"}, &fx.dir);
  expect_clean_error(es, "k = 0", {"index", "search", "--index", fx.index, "-q", fx.queries, "-k", "0"}, {"-k"},
                     &fx.dir);
  expect_clean_error(es, "non-numeric k", {"index", "search", "--index", fx.index, "-q", fx.queries, "-k", "ten"},
                     {"-k"}, &fx.dir);
  // index eval
  const std::string ee = "tq index eval";
  expect_clean_error(ee, "ground truth ids past the base",
                     {"index", "eval", "--base", fx.base, "-q", fx.queries, "--gt", fx.gt_bad, "--k-max", "10"},
                     {"gt_bad.ivecs", "ground"}, &fx.dir);
  expect_clean_error(ee, "ground truth is a float file",
                     {"index", "eval", "--base", fx.base, "-q", fx.queries, "--gt", fx.empty}, {"empty.bin"}, &fx.dir);
  expect_clean_error(ee, "queries of the wrong dimension",
                     {"index", "eval", "--base", fx.base, "-q", fx.queries_d5, "--gt", fx.gt}, {"dim", "5"}, &fx.dir);
  expect_clean_error(ee, "k-max 0", {"index", "eval", "--base", fx.base, "-q", fx.queries, "--gt", fx.gt, "--k-max", "0"},
                     {"--k-max"}, &fx.dir);
}

TEST(CliBadInput, BenchAttention) {
  const std::string e = "tq bench attention";
  const std::vector<std::string> small = {"--context", "64", "--steps", "1", "--n-heads", "4", "--n-kv-heads", "2",
                                          "--head-dim", "64"};
  expect_clean_error(e, "unknown cache type", with({"bench", "attention", "--kv", "f16,tq9"}, small), {"tq9"});
  expect_clean_error(e, "heads not a multiple of kv heads",
                     {"bench", "attention", "--context", "64", "--n-heads", "6", "--n-kv-heads", "4"},
                     {"multiple", "heads"});
  expect_clean_error(e, "zero head dimension", with({"bench", "attention"}, with(small, {"--head-dim", "0"})),
                     {"head", "dim"});
  expect_clean_error(e, "negative context", with({"bench", "attention"}, with(small, {"--context", "-5"})),
                     {"context"});
  expect_clean_error(e, "non-numeric steps", with({"bench", "attention", "--steps", "x"}, small), {"--steps"});
}

// Regression tests for bugs these tests found:
//  - src/llm/eval.cpp read_text_file(): a directory opened as an empty stream, so
//    `tq perplexity -f <dir>` said "the text has 0 tokens" instead of naming the directory.
TEST(CliBadInput, PerplexityTextFileIsDirectory) {
  Fixtures fx;
  expect_clean_error("tq perplexity", "directory as text file",
                     {"perplexity", "-m", fx.model, "-f", fx.folder, "-c", "64"}, {"a_directory"}, &fx.dir);
}
//  - tools/tq/cmd_bench_attention.cpp: --threads was split and parsed with std::stoi, unchecked:
//    "1,two" printed "tq: error: stoi" and "-1" ran with -1 threads.
TEST(CliBadInput, BenchAttentionThreadList) {
  const std::vector<std::string> small = {"--context", "64", "--steps", "1", "--n-heads", "4", "--n-kv-heads", "2",
                                          "--head-dim", "64"};
  expect_clean_error("tq bench attention", "non-numeric thread list",
                     with({"bench", "attention", "--threads", "1,two"}, small), {"two", "--threads"});
  expect_clean_error("tq bench attention", "negative thread count",
                     with({"bench", "attention", "--threads", "-1"}, small), {"-1", "--threads"});
}
