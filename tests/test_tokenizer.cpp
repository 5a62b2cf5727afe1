// Tokenizer: tiny byte-level BPE and SentencePiece vocabularies written by the test (merge
// order, pre-tokenizer rules, scores, byte fallback, specials, round trips, chat formats), then
// the real SmolLM2 tokenizer: ids for fixed strings (checked against Hugging Face `tokenizers`
// built from the same GGUF vocabulary and merges, see bench/llama_cpp_reference.py) and an exact
// round trip of the whole corpus; then every tokenizer against llama.cpp's ids saved by
// bench/llama_cpp_tokenizer_reference.py (bench/results/tokenizer_reference.json): SmolLM2,
// Gemma 3 (the real vocabulary), Qwen 2 and Llama 3 pre-tokenizers (a test vocabulary built
// from SmolLM2's, the recipe of bench/make_tokenizer_vocabs.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llm_test_util.h"
#include "sha256_util.h"
#include "tq/error.h"
#include "tq/eval.h"
#include "tq/gguf.h"
#include "tq/tokenizer.h"

namespace {

// GPT-2 byte alphabet for one byte (the printable-Latin-1 rule), as UTF-8.
std::string byte_char(int b) {
  static std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
      const int cp = printable ? c : next++;
      std::string s;
      if (cp < 0x80) s += static_cast<char>(cp);
      else { s += static_cast<char>(0xC0 | (cp >> 6)); s += static_cast<char>(0x80 | (cp & 0x3F)); }
      t[c] = s;
    }
    return t;
  }();
  return table[b];
}

// Vocabulary: <|endoftext|>, <|im_start|>, <|im_end|>, the 256 byte tokens, then merges.
tq::GgufFile tiny_tokenizer(std::vector<uint8_t>& storage, const std::string& pre = "smollm") {
  tq::GgufWriter w;
  std::vector<std::string> toks = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  std::vector<int32_t> types = {3, 3, 3};
  for (int b = 0; b < 256; ++b) {
    toks.push_back(byte_char(b));
    types.push_back(1);
  }
  const std::string G = byte_char(' ');  // "Ġ"
  const std::vector<std::string> merges = {"h e", "l l", "he ll", "hell o", G + " w", G + "w o", "r l",
                                           G + "wo rl", G + "worl d", "1 2"};
  for (auto& m : merges) {
    toks.push_back(m.substr(0, m.find(' ')) + m.substr(m.find(' ') + 1));
    types.push_back(1);
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set_str_array("tokenizer.ggml.tokens", toks);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_str_array("tokenizer.ggml.merges", merges);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  w.set_string("tokenizer.chat_template",
               "{% for m in messages %}{{'<|im_start|>system\nBe brief.<|im_end|>\n'}}{% endfor %}");
  storage = w.bytes();
  return tq::GgufFile::from_bytes(storage.data(), storage.size());
}

constexpr int kFirstMerge = 3 + 256;

}  // namespace

TEST(Tokenizer, TinyVocabMergesInRankOrder) {
  std::vector<uint8_t> st;
  auto g = tiny_tokenizer(st);
  tq::Tokenizer tok(g);
  EXPECT_EQ(tok.n_vocab(), 3 + 256 + 10);
  // "hello world": merges he, ll, hell, hello; Ġw, Ġwo, rl, Ġworl, Ġworld.
  EXPECT_EQ(tok.encode("hello world"), (std::vector<int32_t>{kFirstMerge + 3, kFirstMerge + 8}));
  // "hel" stops at "he" + "l" (no "he l" merge).
  EXPECT_EQ(tok.encode("hel"), (std::vector<int32_t>{kFirstMerge + 0, 3 + 'l'}));
  // Digits are split one by one before BPE (smollm), so the "1 2" merge never applies.
  EXPECT_EQ(tok.encode("12"), (std::vector<int32_t>{3 + '1', 3 + '2'}));
  // With the plain GPT-2 pre-tokenizer "12" is one piece and merges.
  std::vector<uint8_t> st2;
  auto g2 = tiny_tokenizer(st2, "gpt2");
  tq::Tokenizer tok2(g2);
  EXPECT_EQ(tok2.encode("12"), (std::vector<int32_t>{kFirstMerge + 9}));
}

TEST(Tokenizer, TinyRoundTripAndSpecials) {
  std::vector<uint8_t> st;
  auto g = tiny_tokenizer(st);
  tq::Tokenizer tok(g);
  const std::vector<std::string> texts = {"", " ", "a  b\n\n\tc ", "Ünïcödé 東京 🚀 z", "it's 3.14!", "\x01\x7f",
                                          "<|im_start|>user\nhi<|im_end|>"};
  for (auto& t : texts) EXPECT_EQ(tok.decode(tok.encode(t)), t) << t;
  // Specials: recognised only with parse_special, rendered only with render_special.
  const std::string chat = "<|im_start|>user\nhi<|im_end|>";
  auto ids = tok.encode(chat, true);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_EQ(tok.decode(ids, true), chat);
  EXPECT_EQ(tok.decode(ids, false), "user\nhi");
  EXPECT_NE(tok.encode(chat, false).front(), 1);
  EXPECT_TRUE(tok.is_end_of_generation(2));
  EXPECT_TRUE(tok.is_end_of_generation(0));
  EXPECT_FALSE(tok.is_end_of_generation(5));
  // Invalid UTF-8 is an error, not garbage.
  EXPECT_THROW(tok.encode(std::string("\xff\xfe")), tq::Error);
  EXPECT_THROW(tok.token_to_piece(100000), tq::Error);
  // ChatML with the template's default system message.
  EXPECT_EQ(tok.apply_chat_template({{"user", "Hi"}}),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tok.apply_chat_template({{"system", "S"}, {"user", "Hi"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(Tokenizer, RejectsUnsupported) {
  std::vector<uint8_t> st;
  auto g = tiny_tokenizer(st, "no-such-pre");
  try {
    tq::Tokenizer tok(g);
    ADD_FAILURE() << "unknown pre-tokenizer accepted";
  } catch (const tq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("pre-tokenizer"), std::string::npos) << e.what();
  }
  tq::GgufWriter w;
  w.set_string("tokenizer.ggml.model", "llama");  // SentencePiece without a vocabulary
  auto b = w.bytes();
  auto g2 = tq::GgufFile::from_bytes(b.data(), b.size());
  EXPECT_THROW(tq::Tokenizer t2(g2), tq::Error);
  tq::GgufWriter w3;
  w3.set_string("tokenizer.ggml.model", "t5");  // Unigram: not supported, and said so
  w3.set_str_array("tokenizer.ggml.tokens", {"a"});
  auto b3 = w3.bytes();
  auto g3 = tq::GgufFile::from_bytes(b3.data(), b3.size());
  try {
    tq::Tokenizer t3(g3);
    ADD_FAILURE() << "tokenizer model t5 accepted";
  } catch (const tq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'t5' is not supported"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, RealModelKnownIdsAndCorpusRoundTrip) {
  const std::string path = tq_test::real_model_path();
  if (!tq_test::file_exists(path)) GTEST_SKIP() << path << " missing: run scripts/fetch-model.sh (make test does)";
  auto g = tq::GgufFile::open(path);
  tq::Tokenizer tok(g);
  EXPECT_EQ(tok.n_vocab(), 49152);
  EXPECT_EQ(tok.pre_type(), "smollm");
  EXPECT_FALSE(tok.add_bos());
  // Expected ids from Hugging Face `tokenizers` (BPE + Digits(individual) + ByteLevel) built
  // from this GGUF's vocabulary and merges; see bench/llama_cpp_reference.py --hf-tokenizer.
  EXPECT_EQ(tok.encode("Hello world!"), (std::vector<int32_t>{19556, 905, 17}));
  EXPECT_EQ(tok.encode("The Debian GNU/Linux system"),
            (std::vector<int32_t>{504, 1413, 14958, 28807, 31, 37656, 817}));
  EXPECT_EQ(tok.encode("  x = 3.14159;\n\tif (a != b) return -1;"),
            (std::vector<int32_t>{216, 1792, 446, 216, 35, 30, 33, 36, 33, 37, 41, 43, 198, 197, 342, 365, 81,
                                  6541, 278, 25, 1003, 731, 33, 43}));
  EXPECT_EQ(tok.encode("naïve café — 東京 🚀"),
            (std::vector<int32_t>{3546, 46494, 37366, 1841, 17097, 247, 126, 16736, 122, 15107, 244, 218}));
  EXPECT_EQ(tok.encode("<|im_start|>user"), (std::vector<int32_t>{44, 108, 306, 79, 3738, 108, 46, 4093}));
  EXPECT_EQ(tok.encode("<|im_start|>user", true), (std::vector<int32_t>{1, 4093}));
  EXPECT_TRUE(tok.is_end_of_generation(2));  // <|im_end|>

  const std::string cpath = tq_test::corpus_path();
  if (!tq_test::file_exists(cpath)) GTEST_SKIP() << cpath << " missing: run scripts/fetch-corpus.sh (make test does)";
  const std::string text = tq::read_text_file(cpath);
  const auto ids = tok.encode(text);
  EXPECT_EQ(ids.size(), 212507u);  // same count as Hugging Face tokenizers on this file
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(Tokenizer, Sha256KnownVectors) {
  // FIPS 180-4 examples.
  tq_test::Sha256 h;
  h.update(std::string("abc"));
  EXPECT_EQ(h.hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  h.update(std::string("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"));
  EXPECT_EQ(h.hex(), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(h.hex(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");  // empty
  // ids as little-endian int32: [1, 256] -> 01 00 00 00 00 01 00 00
  tq_test::Sha256 h2;
  const uint8_t b[8] = {1, 0, 0, 0, 0, 1, 0, 0};
  h2.update(b, 8);
  EXPECT_EQ(tq_test::ids_sha256({1, 256}), h2.hex());
}

TEST(Tokenizer, TinyQwen2AndLlama3DigitRules) {
  // Same vocabulary (merge "1 2" -> "12"), three digit rules: smollm one digit per piece (tested
  // above), qwen2 one digit per piece, llama3 up to three.
  std::vector<uint8_t> st, st3;
  auto gq = tiny_tokenizer(st, "qwen2");
  auto gl = tiny_tokenizer(st3, "llama-bpe");
  tq::Tokenizer q(gq), l(gl);
  EXPECT_EQ(q.pre_type(), "qwen2");
  EXPECT_EQ(q.encode("12"), (std::vector<int32_t>{3 + '1', 3 + '2'}));
  EXPECT_EQ(l.encode("12"), (std::vector<int32_t>{kFirstMerge + 9}));
  // "1212": llama3 pieces "121" + "2" -> [12, 1, 2]; qwen2 four single digits.
  EXPECT_EQ(l.encode("1212"), (std::vector<int32_t>{kFirstMerge + 9, 3 + '1', 3 + '2'}));
  EXPECT_EQ(q.encode("1212").size(), 4u);
  // Both: a letter run takes one leading non-letter (" world" -> Ġworld), newlines end pieces.
  EXPECT_EQ(l.encode("hello world"), (std::vector<int32_t>{kFirstMerge + 3, kFirstMerge + 8}));
  EXPECT_EQ(q.encode("hello world"), l.encode("hello world"));
  for (auto* t : {&q, &l})
    for (const std::string s : {"a  b\n\n\tc ", "it's 3.14!", "x\r\n\r\n  y", "Ünïcödé 東京 🚀 z"})
      EXPECT_EQ(t->decode(t->encode(s)), s) << s;
}

namespace {

// A tiny SentencePiece vocabulary: controls, unknown, user-defined pieces, 256 byte pieces,
// then scored pieces.
struct TinySpm {
  std::vector<std::string> toks;
  std::vector<int32_t> types;
  std::vector<float> scores;
  int32_t add(const std::string& t, int type, float score) {
    toks.push_back(t);
    types.push_back(type);
    scores.push_back(score);
    return static_cast<int32_t>(toks.size() - 1);
  }
};
constexpr int kSpmByte0 = 11;  // id of <0x00>

tq::GgufFile tiny_spm(std::vector<uint8_t>& storage, bool add_space_prefix, bool add_eos = false) {
  TinySpm v;
  v.add("<pad>", 3, 0);                // 0
  v.add("<eos>", 3, 0);                // 1
  v.add("<bos>", 3, 0);                // 2
  v.add("<unk>", 2, 0);                // 3
  v.add("<start_of_turn>", 3, 0);      // 4
  v.add("<end_of_turn>", 3, 0);        // 5
  v.add("\n", 4, 0);                   // 6
  v.add("\n\n", 4, 0);                 // 7
  v.add("<b>", 4, 0);                  // 8
  v.add("QR", 4, 0);                   // 9
  v.add("RST", 4, 0);                  // 10
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) v.add(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">", 6, 0);
  const std::string U = "\xE2\x96\x81";  // U+2581
  for (const char* c : {"a", "b", "c", "x", "y", "z", "h", "i", "u", "s", "e", "r", "m", "o", "d", "l"})
    v.add(c, 1, -10);
  v.add(U, 1, -5);
  v.add("ab", 1, -2);   // "abc": bc scores higher -> a + bc
  v.add("bc", 1, -1);
  v.add("xy", 1, -1);   // "xyz": equal scores -> the leftmost pair: xy + z
  v.add("yz", 1, -1);
  v.add(U + "a", 1, -3);
  v.add("hi", 1, -4);
  v.add("user", 1, -20);
  v.add("us", 1, -6);
  v.add("er", 1, -7);
  v.add("use", 1, -8);
  v.add("model", 1, -20);
  v.add("mo", 1, -6);
  v.add("mod", 1, -7);
  v.add("de", 1, -6);
  v.add("del", 1, -8);
  tq::GgufWriter w;
  w.set_string("general.architecture", "gemma3");
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string("tokenizer.ggml.pre", "default");
  w.set_str_array("tokenizer.ggml.tokens", v.toks);
  w.set_f32_array("tokenizer.ggml.scores", v.scores);
  w.set_i32_array("tokenizer.ggml.token_type", v.types);
  w.set_u32("tokenizer.ggml.bos_token_id", 2);
  w.set_u32("tokenizer.ggml.eos_token_id", 1);
  w.set_u32("tokenizer.ggml.unknown_token_id", 3);
  w.set_bool("tokenizer.ggml.add_space_prefix", add_space_prefix);
  if (add_eos) w.set_bool("tokenizer.ggml.add_eos_token", true);
  storage = w.bytes();
  return tq::GgufFile::from_bytes(storage.data(), storage.size());
}

}  // namespace

TEST(Tokenizer, TinySentencePieceScoresBytesSpecials) {
  std::vector<uint8_t> st;
  auto g = tiny_spm(st, /*add_space_prefix=*/false);
  tq::Tokenizer tok(g);
  EXPECT_EQ(tok.model_type(), "llama");
  EXPECT_TRUE(tok.add_bos());  // SentencePiece default when the key is absent
  EXPECT_FALSE(tok.add_eos());
  const int32_t a = tok.token_id("a"), b = tok.token_id("b"), c = tok.token_id("c"), z = tok.token_id("z");
  const int32_t sp = tok.token_id("\xE2\x96\x81");
  ASSERT_GE(a, 0);
  // The highest-scoring pair merges first, not the leftmost: a + bc.
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{a, tok.token_id("bc")}));
  // Equal scores: the leftmost pair.
  EXPECT_EQ(tok.encode("xyz"), (std::vector<int32_t>{tok.token_id("xy"), z}));
  // Spaces are U+2581; no prefix space here (Gemma).
  EXPECT_EQ(tok.encode("a b"), (std::vector<int32_t>{a, sp, b}));
  EXPECT_EQ(tok.encode(" a"), (std::vector<int32_t>{tok.token_id("\xE2\x96\x81" "a")}));
  // Byte fallback: "é" (C3 A9) is no piece.
  EXPECT_EQ(tok.encode("é"), (std::vector<int32_t>{kSpmByte0 + 0xC3, kSpmByte0 + 0xA9}));
  EXPECT_EQ(tok.decode({kSpmByte0 + 0xC3, kSpmByte0 + 0xA9}), "é");
  EXPECT_EQ(tok.token_to_piece(kSpmByte0 + 0x41), "A");
  // User-defined pieces split the text always, longest first; "\n\n\n" -> "\n\n" + "\n".
  EXPECT_EQ(tok.encode("a\nb"), (std::vector<int32_t>{a, 6, b}));
  EXPECT_EQ(tok.encode("\n\n\n"), (std::vector<int32_t>{7, 6}));
  EXPECT_EQ(tok.encode("<b>c"), (std::vector<int32_t>{8, c}));
  // Longest first over the whole text, not leftmost first: "QRST" -> Q (byte) + RST.
  EXPECT_EQ(tok.encode("QRST"), (std::vector<int32_t>{kSpmByte0 + 'Q', 10}));
  // Control and unknown pieces only with parse_special.
  EXPECT_EQ(tok.encode("<start_of_turn>a<unk>", true), (std::vector<int32_t>{4, a, 3}));
  const auto plain = tok.encode("<start_of_turn>");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 4), 0);
  EXPECT_EQ(plain.front(), kSpmByte0 + '<');  // no "<" piece: its byte
  EXPECT_EQ(tok.decode(plain), "<start_of_turn>");
  // Round trips, specials rendered only when asked.
  for (const std::string s : {"", " ", "abc xyz", "  a  b\n\n\nc ", "Ünïcödé 東京 🚀", "\x01\x7f", "<b>QRST</b>"})
    EXPECT_EQ(tok.decode(tok.encode(s)), s) << s;
  const auto ids = tok.encode_with_bos("<start_of_turn>user\nhi<end_of_turn>", true);
  EXPECT_EQ(ids.front(), 2);
  EXPECT_EQ(ids[1], 4);
  EXPECT_EQ(ids.back(), 5);
  EXPECT_EQ(tok.decode(ids, true), "<bos><start_of_turn>user\nhi<end_of_turn>");
  EXPECT_EQ(tok.decode(ids, false), "user\nhi");
  EXPECT_TRUE(tok.is_end_of_generation(1));
  EXPECT_TRUE(tok.is_end_of_generation(5));  // <end_of_turn>
  EXPECT_FALSE(tok.is_end_of_generation(a));
  EXPECT_THROW(tok.encode(std::string("a\xc3")), tq::Error);  // truncated UTF-8
  EXPECT_THROW(tok.encode(std::string("\xed\xa0\x80")), tq::Error);  // a surrogate
  EXPECT_THROW(tok.token_to_piece(-1), tq::Error);
  EXPECT_THROW(tok.decode({tok.n_vocab()}), tq::Error);
}

TEST(Tokenizer, TinySentencePieceSpacePrefixAndEos) {
  std::vector<uint8_t> st;
  auto g = tiny_spm(st, /*add_space_prefix=*/true, /*add_eos=*/true);
  tq::Tokenizer tok(g);
  EXPECT_TRUE(tok.add_eos());
  const int32_t ua = tok.token_id("\xE2\x96\x81" "a"), sp = tok.token_id("\xE2\x96\x81"), b = tok.token_id("b");
  // "a b" -> "▁a▁b": the prefix space joins the first word.
  EXPECT_EQ(tok.encode("a b"), (std::vector<int32_t>{ua, sp, b}));
  EXPECT_EQ(tok.decode(tok.encode("a b")), "a b");  // the prefix space is dropped again
  EXPECT_EQ(tok.encode_with_bos("a"), (std::vector<int32_t>{2, ua, 1}));
  // After a special token the next fragment gets the prefix space too (llama.cpp).
  EXPECT_EQ(tok.encode("<start_of_turn>a", true), (std::vector<int32_t>{4, ua}));
}

TEST(Tokenizer, GemmaChatTemplate) {
  std::vector<uint8_t> st;
  auto g = tiny_spm(st, false);
  tq::Tokenizer tok(g);
  EXPECT_EQ(tok.chat_format(), "gemma");  // no tokenizer.chat_template: from the architecture
  EXPECT_EQ(tok.apply_chat_template({{"user", "Hi"}}),
            "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(tok.apply_chat_template({{"system", " Be brief. "}, {"user", " Hi\n"}, {"assistant", "Hello."},
                                     {"user", "Bye"}},
                                    false),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n");
  // The prompt `tq generate --chat` builds: BOS first, then the turn markers as single tokens.
  const auto ids = tok.encode_with_bos(tok.apply_chat_template({{"user", "hi"}}), true);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 4);
  EXPECT_EQ(ids.back(), 6);  // "\n" after "model"
  // ChatML stays ChatML.
  std::vector<uint8_t> st2;
  auto g2 = tiny_tokenizer(st2);
  EXPECT_EQ(tq::Tokenizer(g2).chat_format(), "chatml");
  // A template of neither kind is a clear error.
  tq::GgufWriter w;
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_str_array("tokenizer.ggml.tokens", {"<s>", "a"});
  w.set_string("tokenizer.chat_template", "{{ '[INST] ' + m + ' [/INST]' }}");
  auto b = w.bytes();
  auto g3 = tq::GgufFile::from_bytes(b.data(), b.size());
  tq::Tokenizer t3(g3);
  EXPECT_EQ(t3.chat_format(), "");
  try {
    t3.apply_chat_template({{"user", "x"}});
    ADD_FAILURE() << "unknown chat template accepted";
  } catch (const tq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not supported"), std::string::npos) << e.what();
  }
}

// ---- Against llama.cpp: ids saved by bench/llama_cpp_tokenizer_reference.py ----

namespace {

const nlohmann::json* llama_cpp_reference() {
  static const nlohmann::json ref = [] {
    std::ifstream f(tq_test::source_path("bench/results/tokenizer_reference.json"));
    if (!f) return nlohmann::json();
    return nlohmann::json::parse(f);
  }();
  return ref.is_null() ? nullptr : &ref;
}

// The metadata of a GGUF file without its tensors (the tokenizer needs only the metadata, and
// this reads files whose weight types tq does not know): the head of the file with the tensor
// count set to 0.
tq::GgufFile gguf_metadata_only(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> buf(64u << 20);
  f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
  buf.resize(static_cast<size_t>(f.gcount()));
  if (buf.size() >= 24) std::fill(buf.begin() + 8, buf.begin() + 16, 0);
  return tq::GgufFile::from_bytes(buf.data(), buf.size());
}

// bench/make_tokenizer_vocabs.py's BPE test vocabulary, rebuilt from SmolLM2's: its tokens and
// types, then "00".."99" and "000".."999", then "Ġzqxj"; its merges, then "a b" and "ab c".
std::vector<uint8_t> bpe_test_vocab(const tq::GgufFile& smol, const std::string& pre, std::string& digest) {
  std::vector<std::string> toks = smol.get_str_array("tokenizer.ggml.tokens");
  std::vector<int32_t> types(smol.get_int_array("tokenizer.ggml.token_type").begin(),
                             smol.get_int_array("tokenizer.ggml.token_type").end());
  std::vector<std::string> merges = smol.get_str_array("tokenizer.ggml.merges");
  const std::string d = "0123456789";
  for (char a : d)
    for (char b : d) {
      toks.push_back({a, b});
      types.push_back(1);
      merges.push_back(std::string{a} + " " + b);
    }
  for (char a : d)
    for (char b : d)
      for (char c : d) {
        toks.push_back({a, b, c});
        types.push_back(1);
        merges.push_back(std::string{a, b} + " " + c);
      }
  toks.push_back("\xC4\xA0zqxj");  // Ġzqxj
  types.push_back(1);
  tq_test::Sha256 h;
  for (auto& t : toks) h.update(t + "\n");
  for (auto& m : merges) h.update(m + "\n");
  digest = h.hex();
  tq::GgufWriter w;
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set_str_array("tokenizer.ggml.tokens", toks);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_str_array("tokenizer.ggml.merges", merges);
  for (const char* k : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
                        "tokenizer.ggml.padding_token_id"})
    if (smol.has(k)) w.set_u32(k, static_cast<uint32_t>(smol.get_uint(k)));
  return w.bytes();
}

// tq's ids for every fixed string and the whole corpus against llama.cpp's.
void expect_llama_cpp_ids(const nlohmann::json& ref, const std::string& name, const tq::Tokenizer& tok) {
  ASSERT_TRUE(ref["tokenizers"].contains(name)) << name;
  const auto& t = ref["tokenizers"][name];
  EXPECT_EQ(tok.n_vocab(), t["n_vocab"].get<int>()) << name;
  EXPECT_EQ(tok.add_bos(), t["llama_cpp_add_bos"].get<bool>()) << name;
  EXPECT_EQ(tok.add_eos(), t["llama_cpp_add_eos"].get<bool>()) << name;
  const auto& strings = ref["strings"];
  ASSERT_EQ(strings.size(), t["ids"].size());
  int agree = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    const std::string text = strings[i]["text"].get<std::string>();
    const bool special = strings[i]["parse_special"].get<bool>();
    const auto want = t["ids"][i].get<std::vector<int32_t>>();
    const auto got = tok.encode(text, special);
    EXPECT_EQ(got, want) << name << ": string " << i << " '" << text << "' (parse_special " << special << ")";
    agree += got == want;
  }
  std::printf("[ %s ] %d of %zu fixed strings identical to llama.cpp\n", name.c_str(), agree, strings.size());
  const std::string cpath = tq_test::corpus_path();
  if (!tq_test::file_exists(cpath)) return;
  const std::string text = tq::read_text_file(cpath);
  tq_test::Sha256 h;
  h.update(text);
  if (h.hex() != ref["corpus_sha256"].get<std::string>()) {
    ADD_FAILURE() << cpath << " is not the corpus the reference was made on";
    return;
  }
  const auto ids = tok.encode(text);
  EXPECT_EQ(ids.size(), t["corpus"]["n_tokens"].get<size_t>()) << name;
  EXPECT_EQ(tq_test::ids_sha256(ids), t["corpus"]["sha256"].get<std::string>()) << name << ": corpus ids differ";
  EXPECT_EQ(tok.decode(ids), text) << name << ": corpus decode round trip";
}

}  // namespace

TEST(TokenizerLlamaCpp, SmolLM2) {
  const auto* ref = llama_cpp_reference();
  if (!ref) GTEST_SKIP() << "bench/results/tokenizer_reference.json missing: scripts/llama_cpp_tokenizer_reference.sh";
  const std::string path = tq_test::real_model_path();
  if (!tq_test::file_exists(path)) GTEST_SKIP() << path << " missing: run scripts/fetch-model.sh";
  auto g = tq::GgufFile::open(path);
  tq::Tokenizer tok(g);
  expect_llama_cpp_ids(*ref, "smollm2", tok);
}

TEST(TokenizerLlamaCpp, Gemma3) {
  const auto* ref = llama_cpp_reference();
  if (!ref) GTEST_SKIP() << "bench/results/tokenizer_reference.json missing: scripts/llama_cpp_tokenizer_reference.sh";
  const std::string path = tq_test::source_path("models/gemma-3-270m-q4_k_m.gguf");
  if (!tq_test::file_exists(path)) GTEST_SKIP() << path << " missing: run scripts/fetch-model.sh gemma3-270m";
  auto g = gguf_metadata_only(path);
  tq::Tokenizer tok(g);
  EXPECT_EQ(tok.model_type(), "llama");
  EXPECT_EQ(tok.n_vocab(), 262144);
  EXPECT_EQ(tok.chat_format(), "gemma");
  expect_llama_cpp_ids(*ref, "gemma3", tok);
}

void bpe_pre_reference(const std::string& name, const std::string& pre) {
  const auto* ref = llama_cpp_reference();
  if (!ref) GTEST_SKIP() << "bench/results/tokenizer_reference.json missing: scripts/llama_cpp_tokenizer_reference.sh";
  const std::string path = tq_test::real_model_path();
  if (!tq_test::file_exists(path)) GTEST_SKIP() << path << " missing: run scripts/fetch-model.sh";
  auto smol = tq::GgufFile::open(path);
  std::string digest;
  const auto bytes = bpe_test_vocab(smol, pre, digest);
  // The same vocabulary llama.cpp ran (bench/make_tokenizer_vocabs.py), so only the
  // pre-tokenizer is under test.
  EXPECT_EQ(digest, (*ref)["tokenizers"][name]["vocab_sha256"].get<std::string>());
  EXPECT_EQ(pre, (*ref)["tokenizers"][name]["pre"].get<std::string>());
  auto g = tq::GgufFile::from_bytes(bytes.data(), bytes.size());
  tq::Tokenizer tok(g);
  expect_llama_cpp_ids(*ref, name, tok);
}

TEST(TokenizerLlamaCpp, Qwen2PreTokenizer) { bpe_pre_reference("qwen2", "qwen2"); }
TEST(TokenizerLlamaCpp, Llama3PreTokenizer) { bpe_pre_reference("llama3", "llama-bpe"); }

// tq niah's prompt: the model's BOS first when its tokenizer asks for one (a SentencePiece
// vocabulary by default, as Gemma's), none when it does not (add_bos_token false, as SmolLM2's);
// exactly `context` tokens either way, the haystack taken from the offset picked, the needle's
// digits inside and the question last.
TEST(Tokenizer, NiahPromptOpensWithBosWhenAsked) {
  std::vector<uint8_t> s1, s2;
  auto g_spm = tiny_spm(s1, /*add_space_prefix=*/false);
  auto g_bpe = tiny_tokenizer(s2);
  const tq::Tokenizer spm(g_spm), bpe(g_bpe);
  ASSERT_TRUE(spm.add_bos());
  ASSERT_FALSE(bpe.add_bos());
  for (const tq::Tokenizer* tok : {&spm, &bpe}) {
    std::string corpus;
    for (int i = 0; i < 400; ++i) corpus += "abc xyz hi ";
    const std::vector<int32_t> hay = tok->encode(corpus);
    size_t choices = 0;
    const auto p = tq::niah_prompt(*tok, hay, 300, 0.5, "123456", [&](size_t n) {
      choices = n;
      return n - 1;  // the last offset: the haystack ends at the corpus's end
    });
    ASSERT_EQ(p.size(), 300u);
    const auto question = tok->encode("\n\nThe secret number of the blue dragon is");
    EXPECT_TRUE(std::equal(question.begin(), question.end(), p.end() - question.size()));
    if (tok->add_bos()) {
      EXPECT_EQ(p.front(), tok->bos());
      EXPECT_EQ(std::count(p.begin(), p.end(), tok->bos()), 1);
    } else {
      EXPECT_NE(p.front(), tok->bos());
    }
    const auto needle = tok->encode(" The secret number of the blue dragon is 123456. ");
    EXPECT_NE(std::search(p.begin(), p.end(), needle.begin(), needle.end()), p.end());
    const size_t n_hay = 300 - needle.size() - question.size() - (tok->add_bos() ? 1 : 0);
    EXPECT_EQ(choices, hay.size() - n_hay + 1);
    // The haystack's last token is the corpus's last (offset choices - 1).
    EXPECT_EQ(p[p.size() - question.size() - 1], hay.back());
    // Too short a corpus: an error, not a read past its end.
    EXPECT_THROW(tq::niah_prompt(*tok, std::vector<int32_t>(hay.begin(), hay.begin() + 100), 300, 0.5, "123456",
                                 [](size_t) { return size_t{0}; }),
                 tq::Error);
  }
}
