// Tokenizer: a tiny byte-level BPE vocabulary written by the test (merge order, specials,
// round trips), then the real SmolLM2 tokenizer: ids for fixed strings (checked against
// Hugging Face `tokenizers` built from the same GGUF vocabulary and merges, see
// bench/llama_cpp_reference.py) and an exact round trip of the whole corpus.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "llm_test_util.h"
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
  w.set_string("tokenizer.ggml.model", "llama");  // SentencePiece: not supported
  auto b = w.bytes();
  auto g2 = tq::GgufFile::from_bytes(b.data(), b.size());
  EXPECT_THROW(tq::Tokenizer t2(g2), tq::Error);
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
