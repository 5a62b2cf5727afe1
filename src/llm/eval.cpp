// Perplexity / KLD / top-1 agreement, needle-in-a-haystack and speed runs for LlamaModel.
#include "tq/eval.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>

#include "tq/common.h"
#include "tq/error.h"
#include "tq/tokenizer.h"

namespace tq {

double kv_bits_per_value(const LlamaModel& m, double bytes_per_token) {
  const auto& c = m.config();
  const double values = 2.0 * c.n_layers * c.n_kv_heads * c.head_dim;
  return bytes_per_token * 8.0 / values;
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  TQ_CHECK(!std::filesystem::is_directory(path, ec), "'%s' is a directory, not a text file", path.c_str());
  std::ifstream f(path, std::ios::binary);
  TQ_CHECK(f.good(), "cannot read '%s' (run scripts/fetch-corpus.sh for the default corpus)", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<PerplexityResult> perplexity_multi(const LlamaModel& m, const std::vector<int32_t>& tokens,
                                               const PerplexityOptions& opt,
                                               const std::vector<KvSpec>& configs) {
  const int n_ctx = opt.n_ctx;
  TQ_CHECK(n_ctx >= 16, "perplexity: context %d too small (>= 16)", n_ctx);
  TQ_CHECK(!configs.empty(), "perplexity: no cache config");
  const int avail = static_cast<int>(tokens.size() / n_ctx);
  TQ_CHECK(avail >= 1, "perplexity: the text has %zu tokens, fewer than one window of %d", tokens.size(), n_ctx);
  const int n_chunks = opt.n_chunks > 0 ? std::min(opt.n_chunks, avail) : avail;
  const int V = m.config().n_vocab, E = m.config().n_embd;
  const int first = n_ctx / 2;
  const int n_score = n_ctx - 1 - first;  // rows first .. n_ctx-2 predict tokens first+1 ..
  const size_t nc = configs.size();

  std::vector<PerplexityResult> res(nc);
  std::vector<std::unique_ptr<KvCache>> caches;
  for (size_t c = 0; c < nc; ++c) {
    caches.push_back(std::make_unique<KvCache>(configs[c].resolve(m.config(), n_ctx)));
    res[c].n_ctx = n_ctx;
    res[c].n_chunks = n_chunks;
    res[c].kv_bytes_per_token = caches[c]->bytes_per_token();
    res[c].bits_per_value = kv_bits_per_value(m, res[c].kv_bytes_per_token);
    if (opt.compare) res[c].kld_by_row.assign(static_cast<size_t>(n_score), 0.0);
  }
  std::unique_ptr<KvCache> ref;
  if (opt.compare) {
    ref = std::make_unique<KvCache>(opt.ref.resolve(m.config(), n_ctx));
    for (auto& r : res) r.kv_bytes_per_token_ref = ref->bytes_per_token();
  }

  std::vector<float> hidden(static_cast<size_t>(n_ctx) * E);
  const int blk = 64;  // logits rows per block
  std::vector<float> lg(static_cast<size_t>(blk) * V), lp(static_cast<size_t>(blk) * V);
  std::vector<float> ref_lp;  // n_score * V log-probs of the reference
  std::vector<int32_t> ref_top;
  if (ref) {
    ref_lp.resize(static_cast<size_t>(n_score) * V);
    ref_top.resize(n_score);
  }
  std::vector<double> nll(nc, 0), kld(nc, 0), secs(nc, 0);
  std::vector<size_t> agree(nc, 0), counted(nc, 0);
  std::vector<std::vector<double>> klds(nc);
  double nll_ref = 0;
  const int nt = m.threads();

  const size_t total_steps = static_cast<size_t>(n_chunks) * (nc + (ref ? 1 : 0));
  size_t step = 0;
  for (int ch = 0; ch < n_chunks; ++ch) {
    const int32_t* tk = tokens.data() + static_cast<size_t>(ch) * n_ctx;
    // Log-probs of rows [first, n_ctx-1) in blocks; fn(row, logprobs) per row.
    auto score_rows = [&](const std::function<void(int, const float*)>& fn) {
      for (int r0 = first; r0 < n_ctx - 1; r0 += blk) {
        const int nb = std::min(blk, n_ctx - 1 - r0);
        m.logits(hidden.data() + static_cast<size_t>(r0) * E, nb, lg.data());
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int i = 0; i < nb; ++i)
          log_softmax(lg.data() + static_cast<size_t>(i) * V, V, lp.data() + static_cast<size_t>(i) * V);
        for (int i = 0; i < nb; ++i) fn(r0 + i, lp.data() + static_cast<size_t>(i) * V);
      }
    };
    if (ref) {
      ref->clear();
      m.forward(*ref, tk, n_ctx, hidden.data());
      score_rows([&](int row, const float* p) {
        const int j = row - first;
        std::copy(p, p + V, ref_lp.begin() + static_cast<size_t>(j) * V);
        ref_top[j] = argmax(p, V);
        nll_ref -= p[tk[row + 1]];
      });
      if (opt.progress) opt.progress(++step, total_steps);
    }
    for (size_t c = 0; c < nc; ++c) {
      const double t0 = tq::wall_seconds();
      caches[c]->clear();
      m.forward(*caches[c], tk, n_ctx, hidden.data());
      res[c].kv_bytes_used = std::max(res[c].kv_bytes_used, caches[c]->bytes_used());
      res[c].bits_per_value_all =
          kv_bits_per_value(m, static_cast<double>(res[c].kv_bytes_used) / n_ctx);
      double chunk_nll = 0;
      score_rows([&](int row, const float* p) {
        const double l = -p[tk[row + 1]];
        nll[c] += l;
        chunk_nll += l;
        ++counted[c];
        res[c].top1.push_back(argmax(p, V));
        if (ref) {
          const int j = row - first;
          const float* q = ref_lp.data() + static_cast<size_t>(j) * V;
          double k = 0;
          for (int t = 0; t < V; ++t) k += std::exp(static_cast<double>(q[t])) * (q[t] - p[t]);
          k = std::max(0.0, k);
          kld[c] += k;
          klds[c].push_back(k);
          res[c].kld_by_row[static_cast<size_t>(j)] += k;
          agree[c] += res[c].top1.back() == ref_top[j];
        }
      });
      res[c].chunk_ppl.push_back(std::exp(chunk_nll / n_score));
      secs[c] += tq::wall_seconds() - t0;
      if (opt.progress) opt.progress(++step, total_steps);
    }
  }
  for (size_t c = 0; c < nc; ++c) {
    PerplexityResult& r = res[c];
    r.n_scored = counted[c];
    r.ppl = std::exp(nll[c] / counted[c]);
    r.seconds = secs[c];
    if (ref) {
      r.ppl_ref = std::exp(nll_ref / counted[c]);
      r.kld_mean = kld[c] / counted[c];
      r.top1_agreement = static_cast<double>(agree[c]) / counted[c];
      std::sort(klds[c].begin(), klds[c].end());
      r.kld_p99 = klds[c][std::min(klds[c].size() - 1, static_cast<size_t>(0.99 * klds[c].size()))];
    }
  }
  return res;
}

PerplexityResult perplexity(const LlamaModel& m, const std::vector<int32_t>& tokens,
                            const PerplexityOptions& opt) {
  return perplexity_multi(m, tokens, opt, {opt.kv})[0];
}

std::vector<int32_t> niah_prompt(const Tokenizer& tok, const std::vector<int32_t>& hay, int context,
                                 double depth, const std::string& passphrase,
                                 const std::function<size_t(size_t)>& pick_offset) {
  const std::vector<int32_t> question = tok.encode("\n\nThe secret number of the blue dragon is");
  const std::vector<int32_t> needle = tok.encode(" The secret number of the blue dragon is " + passphrase + ". ");
  // The model's BOS, when its tokenizer asks for one (Gemma does, SmolLM2 does not), opens the
  // prompt as tq generate / perplexity open theirs; it counts in the context.
  const bool bos = tok.add_bos() && tok.bos() >= 0;
  const int n_hay = context - static_cast<int>(needle.size() + question.size()) - (bos ? 1 : 0);
  TQ_CHECK(n_hay > 0 && static_cast<size_t>(n_hay) <= hay.size(),
           "niah: corpus has %zu tokens, not enough for a %d-token haystack", hay.size(), n_hay);
  const size_t off = pick_offset(hay.size() - n_hay + 1);
  TQ_CHECK(off + n_hay <= hay.size(), "niah: haystack offset %zu out of range", off);
  const int at = static_cast<int>(depth * n_hay);
  std::vector<int32_t> prompt;
  prompt.reserve(static_cast<size_t>(context));
  if (bos) prompt.push_back(tok.bos());
  prompt.insert(prompt.end(), hay.begin() + off, hay.begin() + off + at);
  prompt.insert(prompt.end(), needle.begin(), needle.end());
  prompt.insert(prompt.end(), hay.begin() + off + at, hay.begin() + off + n_hay);
  prompt.insert(prompt.end(), question.begin(), question.end());
  return prompt;
}

NiahResult niah(const LlamaModel& m, const Tokenizer& tok, const std::string& corpus,
                const NiahOptions& opt) {
  TQ_CHECK(opt.context >= 256, "niah: context %d too small (>= 256)", opt.context);
  TQ_CHECK(opt.trials >= 1, "niah: trials must be >= 1");
  for (double d : opt.depths) TQ_CHECK(d >= 0 && d <= 1, "niah: depth %g outside [0, 1]", d);
  const std::vector<int32_t> hay = tok.encode(corpus);
  const int answer_budget = 10;
  NiahResult res;
  const double t0 = tq::wall_seconds();
  Rng rng(opt.seed);
  KvCache cache(opt.kv.resolve(m.config(), opt.context + answer_budget));
  const size_t total = opt.depths.size() * static_cast<size_t>(opt.trials);
  size_t done = 0;
  for (double depth : opt.depths) {
    for (int t = 0; t < opt.trials; ++t) {
      NiahTrial tr;
      tr.depth = depth;
      tr.trial = t;
      char digits[16];
      std::snprintf(digits, sizeof digits, "%06u", rng.below(1000000));
      tr.passphrase = digits;
      const std::vector<int32_t> prompt =
          niah_prompt(tok, hay, opt.context, depth, tr.passphrase,
                      [&](size_t n) { return static_cast<size_t>(rng.below(static_cast<uint32_t>(n))); });
      cache.clear();
      std::vector<float> lg = m.forward_last(cache, prompt);
      std::vector<int32_t> out;
      // The answer's tokens, for the margin: followed while greedy decoding agrees with them.
      const std::vector<int32_t> want = tok.encode(" " + tr.passphrase + ".");
      bool on_path = true;
      double margin = std::numeric_limits<double>::infinity();
      for (int i = 0; i < answer_budget; ++i) {
        const int32_t id = argmax(lg.data(), static_cast<int>(lg.size()));
        if (on_path && static_cast<size_t>(i) < want.size()) {
          const int32_t w = want[static_cast<size_t>(i)];
          float other = -std::numeric_limits<float>::infinity();
          for (size_t j = 0; j < lg.size(); ++j)
            if (static_cast<int32_t>(j) != w) other = std::max(other, lg[j]);
          margin = std::min(margin, static_cast<double>(lg[static_cast<size_t>(w)]) - other);
          on_path = id == w;
        }
        if (tok.is_end_of_generation(id)) break;
        out.push_back(id);
        tr.answer = tok.decode(out);
        if (tr.answer.find('.') != std::string::npos || tr.answer.find('\n') != std::string::npos) break;
        if (i + 1 < answer_budget) lg = m.forward_last(cache, {id});
      }
      std::string got;
      for (char ch : tr.answer)
        if (ch >= '0' && ch <= '9') got += ch;
      tr.passed = got == tr.passphrase;
      // Passed on another tokenization of the same digits: no margin along the answer's tokens.
      tr.margin = tr.passed && !on_path ? std::numeric_limits<double>::quiet_NaN() : margin;
      res.trials++;
      res.passed += tr.passed;
      res.details.push_back(tr);
      if (opt.progress) opt.progress(++done, total);
    }
  }
  res.seconds = tq::wall_seconds() - t0;
  return res;
}

SpeedResult bench_speed(const LlamaModel& m, const std::vector<int32_t>& tokens, int context,
                        int decode_tokens, const KvSpec& kv) {
  TQ_CHECK(context >= 1 && static_cast<size_t>(context) <= tokens.size(),
           "bench: %d context tokens requested, %zu available", context, tokens.size());
  KvCache cache(kv.resolve(m.config(), context + decode_tokens));
  SpeedResult r;
  r.context = context;
  std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + context);
  double t0 = tq::wall_seconds();
  std::vector<float> lg = m.forward_last(cache, prompt);
  r.prefill_tok_s = context / (tq::wall_seconds() - t0);
  t0 = tq::wall_seconds();
  for (int i = 0; i < decode_tokens; ++i) {
    const int32_t id = argmax(lg.data(), static_cast<int>(lg.size()));
    lg = m.forward_last(cache, {id});
  }
  r.decode_tokens = decode_tokens;
  r.decode_tok_s = decode_tokens > 0 ? decode_tokens / (tq::wall_seconds() - t0) : 0;
  r.kv_bytes = static_cast<double>(cache.bytes_used());
  r.kv_bytes_per_token = cache.bytes_per_token();
  r.kv_tokens = cache.n_tokens(0);
  return r;
}

}  // namespace tq
