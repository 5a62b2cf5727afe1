// Byte-level BPE tokenizer (GPT-2 family) built from GGUF metadata: tokenizer.ggml.tokens,
// .merges, .token_type, .pre (pre-tokenizer regexes, run with PCRE2 Unicode properties),
// special tokens, and the chat template for instruct models (ChatML is recognised).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tq {

class GgufFile;

struct ChatMessage {
  std::string role;     // "system", "user", "assistant"
  std::string content;
};

class Tokenizer {
 public:
  explicit Tokenizer(const GgufFile& gguf);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Text -> token ids. parse_special: recognise control / user-defined token strings such as
  // "<|im_start|>" in the text (as llama.cpp's parse_special). add_bos follows the model
  // (tokenizer.ggml.add_bos_token) unless overridden. Invalid UTF-8 is a tq::Error.
  std::vector<int32_t> encode(const std::string& text, bool parse_special = false) const;
  std::vector<int32_t> encode_with_bos(const std::string& text, bool parse_special = false) const;
  // Token ids -> bytes. Control tokens are rendered only when render_special.
  std::string decode(const std::vector<int32_t>& ids, bool render_special = false) const;
  std::string token_to_piece(int32_t id, bool render_special = false) const;

  int n_vocab() const noexcept;
  int32_t bos() const noexcept;
  int32_t eos() const noexcept;
  bool add_bos() const noexcept;
  bool is_end_of_generation(int32_t id) const noexcept;  // eos, <|im_end|>, <|endoftext|>
  int32_t token_id(const std::string& token_text) const;  // -1 when absent
  const std::string& token_text(int32_t id) const;        // as stored (byte-level encoded)
  const std::string& pre_type() const noexcept;

  // Chat prompt in the model's format (ChatML for SmolLM: <|im_start|>role\n...<|im_end|>\n),
  // with the template's default system message when the first message is not "system".
  std::string apply_chat_template(const std::vector<ChatMessage>& msgs,
                                  bool add_generation_prompt = true) const;

  struct Impl;
 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tq
