// Byte-level BPE: text -> (special-token split) -> pre-tokenizer regex pieces (PCRE2, UTF +
// Unicode properties) -> bytes mapped to the GPT-2 printable alphabet -> lowest-rank-first
// merges -> vocabulary ids. Decoding maps the alphabet back to bytes.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tq/tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>
#include <shared_mutex>
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

constexpr int kTokNormal = 1, kTokUnknown = 2, kTokControl = 3, kTokUser = 4, kTokByte = 6;

}  // namespace

struct Tokenizer::Impl {
  std::vector<std::string> tokens;
  std::vector<int> types;
  std::unordered_map<std::string, int32_t> tok_id;
  std::unordered_map<std::string, int> merge_rank;  // "left right" -> rank
  std::vector<std::string> byte_to_uni;             // byte -> UTF-8 of its printable stand-in
  std::unordered_map<uint32_t, uint8_t> uni_to_byte;
  std::vector<std::unique_ptr<Regex>> pre;
  std::vector<std::pair<std::string, int32_t>> specials;  // longest first
  std::string pre_type;
  int32_t bos = -1, eos = -1, unk = -1;
  bool add_bos = false;
  std::vector<int32_t> eog;
  std::string chat_template;
  mutable std::shared_mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  void bpe(const std::string& piece, std::vector<int32_t>& out) const;
};

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer::Tokenizer(const GgufFile& g) : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  const std::string model = g.get_string_or("tokenizer.ggml.model", "");
  TQ_CHECK(model == "gpt2", "%s: tokenizer model '%s' is not supported (only byte-level BPE 'gpt2')",
           g.path().c_str(), model.c_str());
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
  for (int i = 0; i < n; ++i) I.tok_id.emplace(I.tokens[i], i);  // first occurrence wins
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
  I.pre_type = g.get_string_or("tokenizer.ggml.pre", "default");
  const std::string gpt2 =
      "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
  std::vector<std::string> pats;
  if (I.pre_type == "smollm" || I.pre_type == "starcoder" || I.pre_type == "refact" ||
      I.pre_type == "command-r" || I.pre_type == "codeshell") {
    pats = {"\\p{N}", gpt2};  // each digit alone, then the GPT-2 rules
  } else if (I.pre_type == "gpt2" || I.pre_type == "default" || I.pre_type == "mpt" ||
             I.pre_type == "olmo") {
    pats = {gpt2};
  } else {
    TQ_CHECK(false, "%s: pre-tokenizer '%s' is not supported (supported: smollm starcoder refact "
             "command-r codeshell gpt2 default mpt olmo)", g.path().c_str(), I.pre_type.c_str());
  }
  for (auto& p : pats) I.pre.push_back(std::make_unique<Regex>(p));

  for (int i = 0; i < n; ++i)
    if ((I.types[i] == kTokControl || I.types[i] == kTokUser) && !I.tokens[i].empty())
      I.specials.emplace_back(I.tokens[i], i);
  std::stable_sort(I.specials.begin(), I.specials.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });

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
  I.add_bos = g.get_bool_or("tokenizer.ggml.add_bos_token", false) && I.bos >= 0;
  if (I.eos >= 0) I.eog.push_back(I.eos);
  for (const char* t : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>"}) {
    auto it = I.tok_id.find(t);
    if (it != I.tok_id.end()) I.eog.push_back(it->second);
  }
  I.chat_template = g.get_string_or("tokenizer.chat_template", "");
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
  std::vector<int32_t> ids;
  for (auto& s : sym) {
    auto it = tok_id.find(s);
    if (it != tok_id.end()) {
      ids.push_back(it->second);
      continue;
    }
    // Not in the vocabulary: fall back to one token per byte stand-in.
    for (size_t i = 0; i < s.size();) {
      size_t n = utf8_len(s, i);
      if (n == 0) n = 1;
      auto jt = tok_id.find(s.substr(i, n));
      if (jt != tok_id.end()) ids.push_back(jt->second);
      else if (unk >= 0) ids.push_back(unk);
      i += n;
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  std::unique_lock lk(cache_mu);
  if (cache.size() < (1u << 20)) cache.emplace(piece, std::move(ids));
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
  // Segments of plain text between special tokens.
  std::vector<std::pair<size_t, size_t>> pieces, sub;
  auto encode_plain = [&](size_t b, size_t e) {
    if (b >= e) return;
    pieces.clear();
    pieces.emplace_back(b, e);
    for (auto& re : I.pre) {
      sub.clear();
      for (auto& p : pieces) re->split(text, p.first, p.second, sub);
      pieces.swap(sub);
    }
    for (auto& p : pieces) I.bpe(text.substr(p.first, p.second - p.first), out);
  };
  size_t pos = 0;
  if (parse_special && !I.specials.empty()) {
    while (pos < text.size()) {
      size_t best = std::string::npos;
      int32_t best_id = -1;
      size_t best_len = 0;
      for (auto& [s, id] : I.specials) {  // longest first: ties at one position go to it
        const size_t f = text.find(s, pos);
        if (f != std::string::npos && (f < best || best == std::string::npos)) {
          best = f;
          best_id = id;
          best_len = s.size();
        }
      }
      if (best == std::string::npos) break;
      encode_plain(pos, best);
      out.push_back(best_id);
      pos = best + best_len;
    }
  }
  encode_plain(pos, text.size());
  return out;
}

std::vector<int32_t> Tokenizer::encode_with_bos(const std::string& text, bool parse_special) const {
  std::vector<int32_t> ids = encode(text, parse_special);
  if (impl_->add_bos) ids.insert(ids.begin(), impl_->bos);
  return ids;
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  const Impl& I = *impl_;
  TQ_CHECK(id >= 0 && id < static_cast<int32_t>(I.tokens.size()), "token id %d outside the vocabulary", id);
  const std::string& t = I.tokens[id];
  const int ty = I.types[id];
  if (ty == kTokControl) return render_special ? t : std::string();
  if (ty == kTokUser) return t;
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
  (void)kTokUnknown;
  (void)kTokByte;
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
  std::string s;
  for (int32_t id : ids) s += token_to_piece(id, render_special);
  return s;
}

int Tokenizer::n_vocab() const noexcept { return static_cast<int>(impl_->tokens.size()); }
int32_t Tokenizer::bos() const noexcept { return impl_->bos; }
int32_t Tokenizer::eos() const noexcept { return impl_->eos; }
bool Tokenizer::add_bos() const noexcept { return impl_->add_bos; }
bool Tokenizer::is_end_of_generation(int32_t id) const noexcept {
  return std::find(impl_->eog.begin(), impl_->eog.end(), id) != impl_->eog.end();
}
int32_t Tokenizer::token_id(const std::string& t) const {
  auto it = impl_->tok_id.find(t);
  return it == impl_->tok_id.end() ? -1 : it->second;
}
const std::string& Tokenizer::token_text(int32_t id) const {
  TQ_CHECK(id >= 0 && id < n_vocab(), "token id %d outside the vocabulary", id);
  return impl_->tokens[id];
}
const std::string& Tokenizer::pre_type() const noexcept { return impl_->pre_type; }

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& msgs,
                                           bool add_generation_prompt) const {
  const std::string& tpl = impl_->chat_template;
  TQ_CHECK(tpl.empty() || tpl.find("<|im_start|>") != std::string::npos,
           "chat template of this model is not ChatML; only ChatML (<|im_start|>) is supported");
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
