// Tokenizers built from GGUF metadata, chosen by tokenizer.ggml.model, with llama.cpp's rules:
//  - "gpt2": byte-level BPE (GPT-2 family): tokenizer.ggml.tokens, .merges, .token_type, .pre
//    (pre-tokenizer regexes, run with PCRE2 Unicode properties: smollm, qwen2, llama3 / llama-bpe,
//    gpt2 and their aliases);
//  - "llama": SentencePiece (Gemma, Llama 1/2): tokens, .scores, .token_type; score-driven
//    bigram merges, byte fallback to <0xNN> pieces, spaces as U+2581, add_space_prefix.
// Both split out special tokens first (user-defined pieces always, control and unknown ones only
// when parse_special), longest first, as llama.cpp's tokenizer_st_partition. Chat templates:
// ChatML and Gemma (<start_of_turn>), chosen from tokenizer.chat_template / the architecture.
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
  // encode_with_bos adds BOS first when add_bos() and EOS last when add_eos() (llama.cpp's
  // add_special).
  std::vector<int32_t> encode(const std::string& text, bool parse_special = false) const;
  std::vector<int32_t> encode_with_bos(const std::string& text, bool parse_special = false) const;
  // Token ids -> bytes. Control tokens are rendered only when render_special. SentencePiece:
  // U+2581 -> space, <0xNN> pieces -> their byte (consecutive ones reassemble UTF-8), and with
  // add_space_prefix the space the encoder put first is dropped by decode().
  std::string decode(const std::vector<int32_t>& ids, bool render_special = false) const;
  std::string token_to_piece(int32_t id, bool render_special = false) const;

  int n_vocab() const noexcept;
  int32_t bos() const noexcept;
  int32_t eos() const noexcept;
  bool add_bos() const noexcept;
  bool add_eos() const noexcept;
  bool is_end_of_generation(int32_t id) const noexcept;  // eos, <|im_end|>, <|endoftext|>
  int32_t token_id(const std::string& token_text) const;  // -1 when absent
  const std::string& token_text(int32_t id) const;        // as stored (byte-level encoded)
  const std::string& pre_type() const noexcept;   // tokenizer.ggml.pre ("default" if absent)
  const std::string& model_type() const noexcept; // tokenizer.ggml.model: "gpt2" or "llama"
  const std::string& chat_format() const noexcept; // "chatml", "gemma", or "" (none known)

  // Chat prompt in the model's format (chat_format()), without BOS (encode_with_bos adds it):
  //  - ChatML (SmolLM): <|im_start|>role\n...<|im_end|>\n, with the template's default system
  //    message when the first message is not "system";
  //  - Gemma: <start_of_turn>user\n...<end_of_turn>\n, "assistant" is "model", a system message
  //    is put before the first user message ("system\n\nuser"), contents trimmed (llama.cpp's
  //    llm_chat_apply_template for gemma); generation prompt <start_of_turn>model\n.
  std::string apply_chat_template(const std::vector<ChatMessage>& msgs,
                                  bool add_generation_prompt = true) const;

  struct Impl;
 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tq
