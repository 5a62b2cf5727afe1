// Tokenizers from GGUF metadata, following llama.cpp (src/llama-vocab.cpp) rule for rule:
//  text -> special-token split (user-defined pieces always, control / unknown ones with
//  parse_special; longest token first over the whole text, as tokenizer_st_partition) ->
//  per plain-text fragment:
//   - byte-level BPE ("gpt2"): pre-tokenizer regex pieces (PCRE2, UTF + Unicode properties) ->
//     bytes mapped to the GPT-2 printable alphabet -> lowest-rank-first merges -> ids (llama3:
//     a piece that is itself a token is taken whole, llama.cpp's ignore_merges);
//   - SentencePiece ("llama"): optional leading space (add_space_prefix, at the start and after
//     a special token), spaces -> U+2581, one symbol per UTF-8 character, then the adjacent pair
//     whose concatenation is the highest-scoring token is merged first (ties: leftmost), until
//     no pair is a token; a symbol that is not a token falls back to one <0xNN> piece per byte.
// Decoding maps the GPT-2 alphabet (BPE) or U+2581 and <0xNN> pieces (SentencePiece) back.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tq/tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstring>
#include <mutex>
#include <queue>
#include <shared_mutex>
#include <string_view>
#include <unordered_map>

#include "tq/error.h"
#include "tq/gguf.h"

namespace tq {

namespace {

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Length of the UTF-8 sequence starting at s[i] (validated), or 0 when invalid.
size_t utf8_len(const std::string& s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n;
  uint32_t cp;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) { n = 2; cp = c & 0x1F; }
  else if ((c & 0xF0) == 0xE0) { n = 3; cp = c & 0x0F; }
  else if ((c & 0xF8) == 0xF0) { n = 4; cp = c & 0x07; }
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const unsigned char d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return n;
}

// Decode one codepoint of a valid UTF-8 string.
uint32_t utf8_cp(const std::string& s, size_t i, size_t n) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (n == 1) return c;
  uint32_t cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

// One compiled PCRE2 pattern (JIT when available).
class Regex {
 public:
  explicit Regex(const std::string& pat) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.c_str()), pat.size(), PCRE2_UTF | PCRE2_UCP,
                          &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      TQ_CHECK(false, "pre-tokenizer regex '%s' does not compile at %zu: %s", pat.c_str(),
               static_cast<size_t>(off), reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Split [b, e) of s into matches and the gaps between them (both kept, in order).
  void split(const std::string& s, size_t b, size_t e, std::vector<std::pair<size_t, size_t>>& out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t pos = b;
    size_t last = b;
    while (pos < e) {
      int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data() + b), e - b, pos - b,
                           PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        TQ_CHECK(false, "pre-tokenizer regex match failed (code %d)", rc);
      }
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t ms = b + ov[0], me = b + ov[1];
      if (me == ms) {  // empty match: step one codepoint
        pos = ms + std::max<size_t>(1, utf8_len(s, ms));
        continue;
      }
      if (ms > last) out.emplace_back(last, ms);
      out.emplace_back(ms, me);
      pos = last = me;
    }
    if (last < e) out.emplace_back(last, e);
    pcre2_match_data_free(md);
  }

 private:
  pcre2_code* code_ = nullptr;
};

// GGUF token types (llama.cpp's LLAMA_TOKEN_TYPE_*).
constexpr int kTokNormal = 1, kTokUnknown = 2, kTokControl = 3, kTokUser = 4, kTokUnused = 5, kTokByte = 6;

const std::string kSpmSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

// Pre-tokenizer regexes (tokenizer.ggml.pre), the patterns of llama.cpp's llm_tokenizer_bpe.
const char* const kGpt2Re =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
// Qwen 2 and Llama 3 differ only in the digit rule: one digit per piece vs up to three.
const char* const kQwen2Re =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kLlama3Re =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct PreRule {
  std::vector<const char*> names;  // tokenizer.ggml.pre values
  std::vector<std::string> regexes;
  bool ignore_merges;              // a piece that is a token is taken whole
  bool add_bos_default;            // when tokenizer.ggml.add_bos_token is absent
};

const std::vector<PreRule>& pre_rules() {
  static const std::vector<PreRule> rules = {
      {{"smollm", "starcoder", "refact", "command-r", "codeshell"}, {"\\p{N}", kGpt2Re}, false, false},
      {{"gpt2", "default", "mpt", "olmo"}, {kGpt2Re}, false, false},
      {{"qwen2", "deepseek-r1-qwen"}, {kQwen2Re}, false, false},
      {{"llama3", "llama-v3", "llama-bpe"}, {kLlama3Re}, true, true},
  };
  return rules;
}

std::string supported_pre_names() {
  std::string s;
  for (auto& r : pre_rules())
    for (auto* n : r.names) {
      if (!s.empty()) s += ' ';
      s += n;
    }
  return s;
}

std::string trim_ws(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

}  // namespace

struct Tokenizer::Impl {
  enum class Kind { Bpe, Spm };
  Kind kind = Kind::Bpe;
  std::string model;
  std::vector<std::string> tokens;
  std::vector<int> types;
  std::vector<float> scores;                             // SentencePiece
  std::unordered_map<std::string_view, int32_t> tok_id;  // views into `tokens`; first occurrence wins
  // BPE
  std::unordered_map<std::string, int> merge_rank;  // "left right" -> rank
  std::vector<std::string> byte_to_uni;             // byte -> UTF-8 of its printable stand-in
  std::unordered_map<uint32_t, uint8_t> uni_to_byte;
  std::vector<std::unique_ptr<Regex>> pre;
  bool ignore_merges = false;
  // SentencePiece
  bool add_space_prefix = false;
  std::vector<int32_t> byte_tok;  // byte -> its <0xNN> token (or the one-byte token), -1 if none
  // Special tokens (control, user-defined, unknown): a byte trie over their texts, and each
  // one's place in llama.cpp's processing order (longest text first).
  struct TrieNode {
    std::vector<std::pair<unsigned char, int32_t>> next;
    int32_t id = -1;
  };
  std::vector<TrieNode> trie;
  std::vector<int32_t> special_rank;  // by id; -1 for ordinary tokens
  std::string pre_type;
  int32_t bos = -1, eos = -1, unk = -1;
  bool add_bos = false, add_eos = false;
  std::vector<int32_t> eog;
  std::string chat_template, chat_format;
  mutable std::shared_mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  int32_t find(std::string_view s) const {
    auto it = tok_id.find(s);
    return it == tok_id.end() ? -1 : it->second;
  }
  void bpe(const std::string& piece, std::vector<int32_t>& out) const;
  void spm(const std::string& text, std::vector<int32_t>& out) const;
  // One plain-text fragment [b, e) of text. Fragments come at the start or after a special
  // token, so SentencePiece's add_space_prefix applies to each (llama.cpp's is_prev_special).
  void encode_fragment(const std::string& text, size_t b, size_t e, std::vector<int32_t>& out) const;
  // Special tokens found in text, as (begin, id) in text order, llama.cpp's partition.
  std::vector<std::pair<size_t, int32_t>> split_specials(const std::string& text, bool parse_special) const;
};

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer::Tokenizer(const GgufFile& g) : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.model = g.get_string_or("tokenizer.ggml.model", "");
  TQ_CHECK(I.model == "gpt2" || I.model == "llama",
           "%s: tokenizer model '%s' is not supported (supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)",
           g.path().c_str(), I.model.c_str());
  I.kind = I.model == "gpt2" ? Impl::Kind::Bpe : Impl::Kind::Spm;
  I.tokens = g.get_str_array("tokenizer.ggml.tokens");
  TQ_CHECK(!I.tokens.empty() && I.tokens.size() < (1u << 30), "%s: bad vocabulary size %zu",
           g.path().c_str(), I.tokens.size());
  const int n = static_cast<int>(I.tokens.size());
  if (g.has("tokenizer.ggml.token_type")) {
    const auto& tt = g.get_int_array("tokenizer.ggml.token_type");
    TQ_CHECK(tt.size() == I.tokens.size(), "%s: %zu token types for %zu tokens", g.path().c_str(),
             tt.size(), I.tokens.size());
    I.types.assign(tt.begin(), tt.end());
  } else {
    I.types.assign(n, kTokNormal);
  }
  I.tok_id.reserve(n * 2);
  for (int i = 0; i < n; ++i) I.tok_id.emplace(std::string_view(I.tokens[i]), i);  // first occurrence wins
  I.pre_type = g.get_string_or("tokenizer.ggml.pre", "default");

  if (I.kind == Impl::Kind::Bpe) {
    const auto& merges = g.get_str_array("tokenizer.ggml.merges");
    I.merge_rank.reserve(merges.size() * 2);
    for (size_t r = 0; r < merges.size(); ++r) {
      const std::string& m = merges[r];
      const size_t sp = m.find(' ', 1);
      TQ_CHECK(sp != std::string::npos && sp + 1 < m.size(), "%s: merge %zu ('%s') is not 'left right'",
               g.path().c_str(), r, m.c_str());
      I.merge_rank.emplace(m, static_cast<int>(r));
    }
    // GPT-2 byte alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes map
    // to U+0100.. in byte order.
    I.byte_to_uni.resize(256);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
      append_utf8(I.byte_to_uni[b], cp);
      I.uni_to_byte[cp] = static_cast<uint8_t>(b);
    }
    // Pre-tokenizer regexes by tokenizer.ggml.pre (the llama.cpp names).
    const PreRule* rule = nullptr;
    for (auto& r : pre_rules())
      for (auto* nm : r.names)
        if (I.pre_type == nm) rule = &r;
    TQ_CHECK(rule, "%s: pre-tokenizer '%s' is not supported (supported: %s)", g.path().c_str(),
             I.pre_type.c_str(), supported_pre_names().c_str());
    for (auto& p : rule->regexes) I.pre.push_back(std::make_unique<Regex>(p));
    I.ignore_merges = rule->ignore_merges;
    I.add_bos = rule->add_bos_default;
  } else {
    if (g.has("tokenizer.ggml.scores")) {
      const GgufValue& v = g.get("tokenizer.ggml.scores");
      TQ_CHECK(v.type == GgufValueType::ARRAY && v.arr_size() == I.tokens.size(),
               "%s: tokenizer.ggml.scores must be an array of %zu numbers", g.path().c_str(), I.tokens.size());
      I.scores.resize(n);
      for (int i = 0; i < n; ++i)
        I.scores[i] = !v.arr_float.empty() ? static_cast<float>(v.arr_float[i])
                      : !v.arr_int.empty() ? static_cast<float>(v.arr_int[i]) : 0.0f;
    } else {
      I.scores.assign(n, 0.0f);
    }
    // Byte fallback: <0xNN>, else the one-byte piece itself (llama.cpp's byte_to_token).
    I.byte_tok.assign(256, -1);
    static const char* hex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const char buf[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
      int32_t id = I.find(buf);
      if (id < 0) id = I.find(std::string(1, static_cast<char>(b)));
      I.byte_tok[b] = id;
    }
    I.add_space_prefix = g.get_bool_or("tokenizer.ggml.add_space_prefix", true);
    I.add_bos = true;  // SentencePiece default, unless the file says otherwise
  }

  // Special tokens: llama.cpp's cache_special_tokens (ids in order, then std::sort by text
  // length, longest first; equal lengths keep the order std::sort gives, as in llama.cpp).
  std::vector<int32_t> sp;
  for (int i = 0; i < n; ++i)
    if ((I.types[i] == kTokControl || I.types[i] == kTokUser || I.types[i] == kTokUnknown) && !I.tokens[i].empty())
      sp.push_back(i);
  std::sort(sp.begin(), sp.end(),
            [&](int32_t a, int32_t b) { return I.tokens[a].size() > I.tokens[b].size(); });
  I.special_rank.assign(n, -1);
  I.trie.assign(1, {});
  for (size_t r = 0; r < sp.size(); ++r) {
    const int32_t id = sp[r];
    I.special_rank[id] = static_cast<int32_t>(r);
    int32_t node = 0;
    for (unsigned char c : I.tokens[id]) {
      int32_t nx = -1;
      for (auto& [ch, child] : I.trie[node].next)
        if (ch == c) { nx = child; break; }
      if (nx < 0) {
        nx = static_cast<int32_t>(I.trie.size());
        I.trie[node].next.emplace_back(c, nx);
        I.trie.emplace_back();
      }
      node = nx;
    }
    if (I.trie[node].id < 0) I.trie[node].id = id;
  }

  auto id_or = [&](const char* key) -> int32_t {
    if (!g.has(key)) return -1;
    const uint64_t v = g.get_uint(key);
    TQ_CHECK(v < static_cast<uint64_t>(n), "%s: %s = %llu is outside the vocabulary", g.path().c_str(),
             key, static_cast<unsigned long long>(v));
    return static_cast<int32_t>(v);
  };
  I.bos = id_or("tokenizer.ggml.bos_token_id");
  I.eos = id_or("tokenizer.ggml.eos_token_id");
  I.unk = id_or("tokenizer.ggml.unknown_token_id");
  I.add_bos = g.get_bool_or("tokenizer.ggml.add_bos_token", I.add_bos) && I.bos >= 0;
  I.add_eos = g.get_bool_or("tokenizer.ggml.add_eos_token", false) && I.eos >= 0;
  if (I.eos >= 0) I.eog.push_back(I.eos);
  for (const char* t : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<end_of_turn>"}) {
    const int32_t id = I.find(t);
    if (id >= 0) I.eog.push_back(id);
  }
  I.chat_template = g.get_string_or("tokenizer.chat_template", "");
  // Chat format: from the template text when there is one, else from the architecture / vocabulary.
  const std::string arch = g.get_string_or("general.architecture", "");
  const bool has_chatml = I.find("<|im_start|>") >= 0 && I.find("<|im_end|>") >= 0;
  const bool has_gemma = I.find("<start_of_turn>") >= 0 && I.find("<end_of_turn>") >= 0;
  if (!I.chat_template.empty()) {
    if (I.chat_template.find("<|im_start|>") != std::string::npos) I.chat_format = "chatml";
    else if (I.chat_template.find("<start_of_turn>") != std::string::npos) I.chat_format = "gemma";
  } else if (arch.rfind("gemma", 0) == 0 && has_gemma) {
    I.chat_format = "gemma";
  } else if (has_chatml) {
    I.chat_format = "chatml";
  } else if (has_gemma) {
    I.chat_format = "gemma";
  }
}

void Tokenizer::Impl::bpe(const std::string& piece, std::vector<int32_t>& out) const {
  {
    std::shared_lock lk(cache_mu);
    auto it = cache.find(piece);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<std::string> sym;
  sym.reserve(piece.size());
  for (unsigned char c : piece) sym.push_back(byte_to_uni[c]);
  std::vector<int32_t> ids;
  int32_t whole = -1;
  if (ignore_merges) {
    std::string enc;
    for (auto& s : sym) enc += s;
    whole = find(enc);
  }
  if (whole >= 0) {
    ids.push_back(whole);
    sym.clear();
  }
  std::string key;
  while (sym.size() > 1) {
    int best = INT_MAX;
    size_t bi = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      key.assign(sym[i]).append(" ").append(sym[i + 1]);
      auto it = merge_rank.find(key);
      if (it != merge_rank.end() && it->second < best) { best = it->second; bi = i; }
    }
    if (best == INT_MAX) break;
    // Merge every occurrence of the best pair, left to right.
    const std::string l = sym[bi], r = sym[bi + 1];
    std::vector<std::string> nxt;
    nxt.reserve(sym.size());
    for (size_t i = 0; i < sym.size();) {
      if (i + 1 < sym.size() && sym[i] == l && sym[i + 1] == r) {
        nxt.push_back(l + r);
        i += 2;
      } else {
        nxt.push_back(std::move(sym[i]));
        ++i;
      }
    }
    sym.swap(nxt);
  }
  for (auto& s : sym) {
    const int32_t id = find(s);
    if (id >= 0) {
      ids.push_back(id);
      continue;
    }
    // Not in the vocabulary: fall back to one token per byte stand-in.
    for (size_t i = 0; i < s.size();) {
      size_t n = utf8_len(s, i);
      if (n == 0) n = 1;
      const int32_t j = find(std::string_view(s).substr(i, n));
      if (j >= 0) ids.push_back(j);
      else if (unk >= 0) ids.push_back(unk);
      i += n;
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  std::unique_lock lk(cache_mu);
  if (cache.size() < (1u << 20)) cache.emplace(piece, std::move(ids));
}

// SentencePiece merges on one escaped fragment (llama.cpp's llm_tokenizer_spm_session): symbols
// are UTF-8 characters; a max-heap of adjacent pairs whose concatenation is a token, by score
// (ties: the leftmost pair); a popped pair whose symbols changed since it was pushed is skipped.
void Tokenizer::Impl::spm(const std::string& text, std::vector<int32_t>& out) const {
  struct Sym { int prev, next; uint32_t off, n; };
  struct Pair { float score; int left, right; uint32_t size; };
  struct Lower {
    bool operator()(const Pair& a, const Pair& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };
  if (text.empty()) return;
  std::vector<Sym> sym;
  sym.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    size_t len = utf8_len(text, off);
    if (len == 0) len = 1;  // not reached: the input was validated
    const int idx = static_cast<int>(sym.size());
    sym.push_back({idx - 1, off + len == text.size() ? -1 : idx + 1, static_cast<uint32_t>(off),
                   static_cast<uint32_t>(len)});
    off += len;
  }
  std::vector<Pair> heap_store;
  heap_store.reserve(sym.size() * 2);
  std::priority_queue<Pair, std::vector<Pair>, Lower> q(Lower{}, std::move(heap_store));
  auto try_pair = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const uint32_t size = sym[l].n + sym[r].n;
    const int32_t id = find(std::string_view(text.data() + sym[l].off, size));
    if (id < 0) return;
    q.push({scores[id], l, r, size});
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_pair(i - 1, i);
  while (!q.empty()) {
    const Pair p = q.top();
    q.pop();
    Sym& L = sym[p.left];
    Sym& R = sym[p.right];
    if (L.n == 0 || R.n == 0 || L.n + R.n != p.size) continue;
    L.n += R.n;
    R.n = 0;
    L.next = R.next;
    if (R.next >= 0) sym[R.next].prev = p.left;
    try_pair(L.prev, p.left);
    try_pair(p.left, L.next);
  }
  for (int i = 0; i != -1; i = sym[i].next) {
    const std::string_view s(text.data() + sym[i].off, sym[i].n);
    const int32_t id = find(s);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (unsigned char c : s) {
      int32_t b = byte_tok[c];
      if (b < 0) b = unk;
      TQ_CHECK(b >= 0, "tokenizer: byte 0x%02X has no <0x%02X> piece and the vocabulary has no unknown token", c, c);
      out.push_back(b);
    }
  }
}

void Tokenizer::Impl::encode_fragment(const std::string& text, size_t b, size_t e,
                                      std::vector<int32_t>& out) const {
  if (b >= e) return;
  if (kind == Kind::Spm) {
    std::string s;
    s.reserve((e - b) * 3 / 2 + 4);
    if (add_space_prefix) s += kSpmSpace;
    for (size_t i = b; i < e; ++i) {
      if (text[i] == ' ') s += kSpmSpace;
      else s += text[i];
    }
    spm(s, out);
    return;
  }
  std::vector<std::pair<size_t, size_t>> pieces, sub;
  pieces.emplace_back(b, e);
  for (auto& re : pre) {
    sub.clear();
    for (auto& p : pieces) re->split(text, p.first, p.second, sub);
    pieces.swap(sub);
  }
  for (auto& p : pieces) bpe(text.substr(p.first, p.second - p.first), out);
}

// llama.cpp's tokenizer_st_partition: for each special token in order (longest text first),
// every occurrence, left to right, that lies wholly in text not yet taken by an earlier token
// (or an earlier occurrence of itself) becomes that token. Control and unknown tokens count only
// with parse_special; user-defined ones always.
std::vector<std::pair<size_t, int32_t>> Tokenizer::Impl::split_specials(const std::string& text,
                                                                        bool parse_special) const {
  // The trie finds which special tokens occur, in groups of occurrences chained by overlaps
  // (an occurrence decides nothing outside its group). Each group is then resolved exactly as
  // llama.cpp does it: its tokens in rank order, each one's occurrences left to right, taken
  // where no byte is taken yet. Memory: the group's distinct tokens and one byte per byte of it.
  std::vector<std::pair<size_t, int32_t>> taken;
  if (trie.size() <= 1) return taken;
  std::vector<int32_t> group;               // distinct tokens of the current group
  std::vector<uint8_t> in_group(tokens.size(), 0);
  std::vector<uint8_t> used;
  size_t group_begin = 0, group_end = 0;
  const std::string_view all(text);
  auto resolve = [&] {
    if (group.empty()) return;
    std::sort(group.begin(), group.end(), [&](int32_t x, int32_t y) { return special_rank[x] < special_rank[y]; });
    used.assign(group_end - group_begin, 0);
    const std::string_view span = all.substr(0, group_end);
    const size_t first = taken.size();
    for (const int32_t id : group) {
      in_group[id] = 0;
      const std::string& t = tokens[id];
      for (size_t cur = group_begin;;) {
        const size_t f = span.find(t, cur);
        if (f == std::string_view::npos) break;
        const size_t b = f - group_begin, e = b + t.size();
        bool free = true;
        for (size_t k = b; k < e && free; ++k) free = !used[k];
        if (!free) {
          cur = f + 1;
          continue;
        }
        std::fill(used.begin() + b, used.begin() + e, 1);
        taken.emplace_back(f, id);
        cur = f + t.size();
      }
    }
    std::sort(taken.begin() + first, taken.end());
    group.clear();
  };
  for (size_t p = 0; p < text.size(); ++p) {
    if (!group.empty() && p >= group_end) resolve();
    int32_t node = 0;
    for (size_t q = p; q < text.size(); ++q) {
      const unsigned char c = static_cast<unsigned char>(text[q]);
      int32_t nx = -1;
      for (auto& [ch, child] : trie[node].next)
        if (ch == c) { nx = child; break; }
      if (nx < 0) break;
      node = nx;
      const int32_t id = trie[node].id;
      if (id >= 0 && (parse_special || types[id] == kTokUser)) {
        if (group.empty()) group_begin = group_end = p;
        if (!in_group[id]) {
          in_group[id] = 1;
          group.push_back(id);
        }
        group_end = std::max(group_end, q + 1);
      }
    }
  }
  resolve();
  return taken;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool parse_special) const {
  const Impl& I = *impl_;
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_len(text, i);
    TQ_CHECK(n != 0, "tokenizer: input is not valid UTF-8 (byte %zu)", i);
    i += n;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  size_t pos = 0;
  for (auto& [at, id] : I.split_specials(text, parse_special)) {
    I.encode_fragment(text, pos, at, out);
    out.push_back(id);
    pos = at + I.tokens[id].size();
  }
  I.encode_fragment(text, pos, text.size(), out);
  return out;
}

std::vector<int32_t> Tokenizer::encode_with_bos(const std::string& text, bool parse_special) const {
  std::vector<int32_t> ids = encode(text, parse_special);
  if (impl_->add_bos) ids.insert(ids.begin(), impl_->bos);
  if (impl_->add_eos) ids.push_back(impl_->eos);
  return ids;
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  const Impl& I = *impl_;
  TQ_CHECK(id >= 0 && id < static_cast<int32_t>(I.tokens.size()), "token id %d outside the vocabulary", id);
  const std::string& t = I.tokens[id];
  const int ty = I.types[id];
  if (ty == kTokControl || ty == kTokUnknown) return render_special ? t : std::string();
  if (ty == kTokUser) return t;
  if (I.kind == Impl::Kind::Spm) {
    if (ty == kTokByte) {
      // "<0xNN>" -> the byte NN.
      TQ_CHECK(t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
                   std::isxdigit(static_cast<unsigned char>(t[4])),
               "token %d ('%s') has the byte type but is not <0xNN>", id, t.c_str());
      return std::string(1, static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
    }
    if (ty == kTokUnused) return std::string();
    std::string out;
    out.reserve(t.size());
    for (size_t i = 0; i < t.size();) {
      if (t.compare(i, kSpmSpace.size(), kSpmSpace) == 0) {
        out += ' ';
        i += kSpmSpace.size();
      } else {
        out += t[i++];
      }
    }
    return out;
  }
  std::string out;
  for (size_t i = 0; i < t.size();) {
    size_t n = utf8_len(t, i);
    if (n == 0) { out += t[i]; ++i; continue; }
    const uint32_t cp = utf8_cp(t, i, n);
    auto it = I.uni_to_byte.find(cp);
    if (it != I.uni_to_byte.end()) out += static_cast<char>(it->second);
    else out.append(t, i, n);
    i += n;
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
  const Impl& I = *impl_;
  std::string s;
  for (size_t k = 0; k < ids.size(); ++k) {
    std::string piece = token_to_piece(ids[k], render_special);
    // SentencePiece with add_space_prefix: the encoder put a space before the text; drop it
    // again from the first piece (llama.cpp's detokenize remove_space).
    if (k == 0 && I.kind == Impl::Kind::Spm && I.add_space_prefix && !piece.empty() && piece[0] == ' ')
      piece.erase(0, 1);
    s += piece;
  }
  return s;
}

int Tokenizer::n_vocab() const noexcept { return static_cast<int>(impl_->tokens.size()); }
int32_t Tokenizer::bos() const noexcept { return impl_->bos; }
int32_t Tokenizer::eos() const noexcept { return impl_->eos; }
bool Tokenizer::add_bos() const noexcept { return impl_->add_bos; }
bool Tokenizer::add_eos() const noexcept { return impl_->add_eos; }
bool Tokenizer::is_end_of_generation(int32_t id) const noexcept {
  return std::find(impl_->eog.begin(), impl_->eog.end(), id) != impl_->eog.end();
}
int32_t Tokenizer::token_id(const std::string& t) const { return impl_->find(t); }
const std::string& Tokenizer::token_text(int32_t id) const {
  TQ_CHECK(id >= 0 && id < n_vocab(), "token id %d outside the vocabulary", id);
  return impl_->tokens[id];
}
const std::string& Tokenizer::pre_type() const noexcept { return impl_->pre_type; }
const std::string& Tokenizer::model_type() const noexcept { return impl_->model; }
const std::string& Tokenizer::chat_format() const noexcept { return impl_->chat_format; }

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& msgs,
                                           bool add_generation_prompt) const {
  const std::string& tpl = impl_->chat_template;
  const std::string& fmt = impl_->chat_format;
  TQ_CHECK(!fmt.empty(),
           "chat template of this model is not supported (supported: ChatML <|im_start|>, Gemma "
           "<start_of_turn>)%s",
           tpl.empty() ? "; the model has no tokenizer.chat_template and no chat tokens" : "");
  if (fmt == "gemma") {
    TQ_CHECK(token_id("<start_of_turn>") >= 0 && token_id("<end_of_turn>") >= 0,
             "the vocabulary has no <start_of_turn>/<end_of_turn> tokens for the Gemma chat format");
    // llama.cpp's LLM_CHAT_TEMPLATE_GEMMA: system text goes before the next non-model turn.
    std::string s, system;
    for (const auto& m : msgs) {
      if (m.role == "system") {
        system += trim_ws(m.content);
        continue;
      }
      const std::string role = m.role == "assistant" ? "model" : m.role;
      s += "<start_of_turn>" + role + "\n";
      if (!system.empty() && role != "model") {
        s += system + "\n\n";
        system.clear();
      }
      s += trim_ws(m.content) + "<end_of_turn>\n";
    }
    if (add_generation_prompt) s += "<start_of_turn>model\n";
    return s;
  }
  TQ_CHECK(token_id("<|im_start|>") >= 0 && token_id("<|im_end|>") >= 0,
           "the vocabulary has no <|im_start|>/<|im_end|> tokens for the ChatML chat format");
  // The template's default system message: the text between "<|im_start|>system" + newline
  // and the next "<|im_end|>" inside the template source (a real or an escaped newline).
  std::string default_system;
  for (const char* nl : {"\n", "\\n"}) {
    const std::string head = std::string("<|im_start|>system") + nl;
    const size_t a = tpl.find(head);
    if (a == std::string::npos) continue;
    const size_t b = tpl.find("<|im_end|>", a + head.size());
    if (b != std::string::npos) default_system = tpl.substr(a + head.size(), b - a - head.size());
    break;
  }
  std::string s;
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (i == 0 && msgs[0].role != "system" && !default_system.empty())
      s += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
    s += "<|im_start|>" + msgs[i].role + "\n" + msgs[i].content + "<|im_end|>\n";
  }
  if (add_generation_prompt) s += "<|im_start|>assistant\n";
  return s;
}

}  // namespace tq
