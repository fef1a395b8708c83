// A test-only Backend that says what it is told: for each sequence, a chooser picks the reply's
// token ids from the prompt (read back through the block table, so prefix-cached prompts work),
// and decode emits them one per step, then the end token. With the real Qwen3 tokenizer and chat
// template this makes the server produce real reasoning and tool calls for protocol and client
// tests. A constrained row (DecodeSeq::allowed) whose scripted token its mask refuses samples as a
// greedy sampler over flat logits would: the lowest allowed id, then and for the rest of its reply.
// The KV slots and the lock are FakeBackend's.
#pragma once

#include <functional>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "../engine/fakes.h"

namespace megadecode::testing {

class ScriptedBackend : public FakeBackend {
 public:
  using Chooser = std::function<std::vector<int32_t>(std::span<const int32_t> prompt)>;

  ScriptedBackend(int vocab, int32_t end_token, Chooser chooser, int n_blocks, int block_size, int max_positions)
      : FakeBackend(n_blocks, block_size, max_positions), end_token_(end_token), chooser_(std::move(chooser)) {
    config_.vocab_size = vocab;
    config_.eos_token_ids = {end_token};
  }
  std::string name() const override { return "scripted"; }

  void prefill(const SeqChunk& chunk, std::span<float> last_logits) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < chunk.tokens.size(); ++i) write(chunk, chunk.start_pos + static_cast<int>(i), chunk.tokens[i]);
    std::fill(last_logits.begin(), last_logits.end(), 0.0f);  // prompt logprobs: a flat distribution
  }

  void decode(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) override {
    std::lock_guard<std::mutex> lock(mutex_);
    result.tokens.clear();
    result.logits.clear();
    for (const DecodeSeq& d : seqs) write(d.chunk, d.chunk.start_pos, d.chunk.tokens[0]);
    for (const DecodeSeq& d : seqs) {
      Script& s = scripts_[d.chunk.seq_id];
      if (!s.chosen) {  // the sequence's first decode step computes the prompt's last token
        const std::vector<int32_t> prompt = read(d.chunk, d.chunk.start_pos + 1);
        s.prompt_len = prompt.size();
        s.reply = chooser_(prompt);
        s.chosen = true;
        prompts_.push_back(prompt);
      }
      const size_t k = static_cast<size_t>(d.chunk.start_pos) + 1 - s.prompt_len;
      int32_t token = k < s.reply.size() && !s.off_script ? s.reply[k] : end_token_;
      auto allows = [&](int32_t t) { return ((d.allowed[static_cast<size_t>(t) >> 5] >> (t & 31)) & 1u) != 0; };
      if (!d.allowed.empty() && (s.off_script || !allows(token))) {
        s.off_script = true;
        token = 0;
        while (token + 1 < config_.vocab_size && !allows(token)) ++token;
      }
      result.tokens.push_back(token);
      if (want_logits) {
        const size_t at = result.logits.size();
        result.logits.resize(at + static_cast<size_t>(config_.vocab_size), -std::numeric_limits<float>::infinity());
        result.logits[at + static_cast<size_t>(token)] = 0.0f;
      }
    }
  }

  // Every prompt a sequence started from, in order.
  std::vector<std::vector<int32_t>> prompts() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return prompts_;
  }

 private:
  struct Script {
    bool chosen = false;
    bool off_script = false;  // a mask refused the reply: lowest allowed ids from there on
    size_t prompt_len = 0;
    std::vector<int32_t> reply;
  };
  int32_t end_token_;
  Chooser chooser_;
  std::map<int64_t, Script> scripts_;  // by sequence id
  std::vector<std::vector<int32_t>> prompts_;
};

}  // namespace megadecode::testing
