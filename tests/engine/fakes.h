// Test doubles for the engine and server: a deterministic fake Backend whose "KV cache" stores
// (position, token) in each slot and whose next token is a function of the history it reads back
// through the block table (so any block-table or prefix-cache mistake changes the output or
// throws), the same backend with steps that run late as on a GPU stream (DeferredFakeBackend), and
// a byte-level fake tokenizer/decoder.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/device_error.h"
#include "core/rng.h"
#include "engine/backend.h"
#include "engine/logits.h"
#include "engine/request.h"
#include "engine/token_constraint.h"
#include "sampling/host_sampler.h"

namespace megadecode::testing {

constexpr int kFakeVocab = 260;  // 0..255 bytes, 256 <|endoftext|>, 257 <|im_start|>, 258 <|im_end|>, 259 <|pad|>
constexpr int32_t kFakeEos = 256;
constexpr int32_t kFakeImEnd = 258;

inline std::string fake_special_text(int32_t t) {
  static const char* names[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"};
  return names[t - 256];
}

// The fake model: logits from a hash of the last three tokens and the length. Printable ASCII is
// likely, the end tokens rare but present.
inline std::vector<float> fake_logits(std::span<const int32_t> history) {
  uint64_t h = history.size();
  for (size_t i = history.size() >= 3 ? history.size() - 3 : 0; i < history.size(); ++i) h = mix64(h ^ history[i]);
  std::vector<float> logits(kFakeVocab);
  for (int v = 0; v < kFakeVocab; ++v) {
    float x = uniform_at(h, 7, v) * 4.0f;
    if (v < 32 || v >= 127) x -= 6.0f;
    logits[v] = x;
  }
  logits[kFakeEos] = uniform_at(h, 8, 0) * 4.0f + 1.0f;  // wins sometimes, greedy included
  return logits;
}

// The fake backend samples like the real ones: the host sampler at the new token's position.
inline int32_t fake_sample(std::span<const float> logits, const SamplingParams& p, int position,
                           std::span<const int32_t> history, size_t n_prompt, std::span<const uint32_t> allowed = {}) {
  n_prompt = std::min(n_prompt, history.size());
  return sampling::sample_token(logits, p, position, sampling::TokenHistory{history.first(n_prompt), history.subspan(n_prompt)},
                                allowed);
}

// A test double of a structured-output constraint (engine/token_constraint.h): after k accepted
// tokens it allows a random share `density` of the vocabulary drawn from (seed, k), never an end
// token, and at least one token; from `accepting_from` tokens on it is accepting (the end tokens are
// allowed too), from `only_end_from` on it allows the end tokens alone; finished after `n_tokens`.
// accept() checks the token against the mask it would fill and keeps every token it took.
class RandomSetConstraint : public TokenConstraint {
 public:
  struct Options {
    int vocab = kFakeVocab;
    uint64_t seed = 0;
    float density = 0.25f;
    int n_tokens = 1 << 30;
    int accepting_from = 1 << 30;
    int only_end_from = 1 << 30;
    std::vector<int32_t> end_tokens = {kFakeEos, kFakeImEnd};
  };
  explicit RandomSetConstraint(Options o) : o_(std::move(o)) {}
  // A fresh constraint of the same options (no token taken yet).
  std::shared_ptr<RandomSetConstraint> fresh() const { return std::make_shared<RandomSetConstraint>(o_); }

  void fill_mask(std::span<uint32_t> words) const override {
    std::fill(words.begin(), words.end(), 0u);
    auto set = [&](int32_t t) { words[t >> 5] |= 1u << (t & 31); };
    const int k = static_cast<int>(accepted.size());
    if (k < o_.only_end_from) {
      int32_t first = -1;
      for (int32_t t = 0; t < o_.vocab; ++t) {
        if (is_end(t)) continue;
        if (first < 0) first = t;
        if (uniform_at(o_.seed, static_cast<uint64_t>(k), static_cast<uint64_t>(t)) * 0.5f + 0.5f < o_.density) set(t);
      }
      const int32_t pick = static_cast<int32_t>(mix64(o_.seed ^ static_cast<uint64_t>(k)) % o_.vocab);
      set(is_end(pick) ? first : pick);  // never empty
    }
    if (accepting())
      for (int32_t t : o_.end_tokens) set(t);
  }
  bool accept(int32_t token) override {
    std::vector<uint32_t> mask(token_mask_words(o_.vocab));
    fill_mask(mask);
    if (token < 0 || token >= o_.vocab || !token_mask_allows(mask.data(), token)) return false;
    accepted.push_back(token);
    return true;
  }
  bool accepting() const override {
    const int k = static_cast<int>(accepted.size());
    return k >= o_.accepting_from || k >= o_.only_end_from || finished();
  }
  bool finished() const override { return static_cast<int>(accepted.size()) >= o_.n_tokens; }

  std::vector<int32_t> accepted;  // every token taken, in order

 private:
  bool is_end(int32_t t) const { return std::find(o_.end_tokens.begin(), o_.end_tokens.end(), t) != o_.end_tokens.end(); }
  Options o_;
};

// A request's constraint replaced by a fresh one of the same options (a run of a workload twice).
inline void refresh_constraint(SequenceRequest& r) {
  if (auto* c = dynamic_cast<RandomSetConstraint*>(r.constraint.get())) r.constraint = c->fresh();
}

// What the engine must produce for one sequence without end tokens: the reference next tokens.
inline std::vector<int32_t> fake_reference(std::vector<int32_t> history, const SamplingParams& p, int n) {
  std::vector<int32_t> out;
  const size_t n_prompt = history.size();
  for (int i = 0; i < n; ++i) {
    auto logits = fake_logits(history);
    const bool penalties = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
    int32_t t = fake_sample(logits, p, static_cast<int>(history.size()),
                            penalties ? std::span<const int32_t>(history) : std::span<const int32_t>(), n_prompt);
    out.push_back(t);
    history.push_back(t);
  }
  return out;
}

// A request for the scheduler tests: ignores end tokens, so it runs max_tokens steps.
inline SequenceRequest make_request(uint64_t id, std::vector<int32_t> prompt, int max_tokens,
                                    std::shared_ptr<OutputSink> sink, float temperature = 0.0f, uint64_t seed = 0) {
  SequenceRequest r;
  r.request_id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  r.sink = std::move(sink);
  return r;
}

class FakeBackend : public Backend {
 public:
  FakeBackend(int n_blocks, int block_size, int max_positions = 4096) : n_blocks_(n_blocks), block_size_(block_size) {
    config_.model_type = "fake";
    config_.vocab_size = kFakeVocab;
    config_.max_position_embeddings = max_positions;
    config_.eos_token_ids = {kFakeEos};
    slots_.assign(static_cast<size_t>(n_blocks) * block_size, kPoison);
  }
  std::string name() const override { return "fake"; }
  const ModelConfig& config() const override { return config_; }
  int kv_block_size() const override { return block_size_; }
  int n_kv_blocks() const override { return n_blocks_; }

  void prefill(const SeqChunk& chunk, std::span<float> last_logits) override {
    std::lock_guard<std::mutex> lock(mutex_);
    pause();
    maybe_fail(chunk.tokens);
    log_.push_back('p');
    prefill_seqs_.push_back(chunk.seq_id);
    n_prefill_tokens_ += chunk.tokens.size();
    for (size_t i = 0; i < chunk.tokens.size(); ++i) write(chunk, chunk.start_pos + static_cast<int>(i), chunk.tokens[i]);
    if (!last_logits.empty()) {
      auto history = read(chunk, chunk.start_pos + static_cast<int>(chunk.tokens.size()));
      auto logits = fake_logits(history);
      std::copy(logits.begin(), logits.end(), last_logits.begin());
    }
  }

  void decode(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) override {
    std::lock_guard<std::mutex> lock(mutex_);
    log_.push_back('d');
    pause();
    max_batch_ = std::max<size_t>(max_batch_, seqs.size());
    result.tokens.clear();
    result.logits.clear();
    result.logprobs.clear();
    if (want_logits) ++n_logit_steps_;
    for (const DecodeSeq& d : seqs) {
      maybe_fail(d.chunk.tokens);
      MD_CHECK(d.chunk.tokens.size() == 1);
      write(d.chunk, d.chunk.start_pos, d.chunk.tokens[0]);
    }
    for (const DecodeSeq& d : seqs) {
      auto history = read(d.chunk, d.chunk.start_pos + 1);
      auto logits = fake_logits(history);
      result.tokens.push_back(
          fake_sample(logits, d.sampling, d.chunk.start_pos + 1, d.history, d.history_prompt_len, d.allowed));
      if (!d.allowed.empty()) ++n_masked_rows_;
      if (want_logits) result.logits.insert(result.logits.end(), logits.begin(), logits.end());
      if (device_logprobs_ >= 0) {  // as a device would: the logprobs, not the logits
        result.logprobs.emplace_back();
        MD_CHECK(d.logprobs <= device_logprobs_, "fake backend: a row asked for ", d.logprobs, " top logprobs");
        if (d.logprobs >= 0) result.logprobs.back() = token_logprob(logits, result.tokens.back(), d.logprobs);
      }
    }
  }
  // With max >= 0 the fake returns the logprobs of rows that ask for at most max top tokens itself
  // (a GPU backend's row_logprobs), so the engine need not ask for the logits.
  void set_device_logprobs(int max) { device_logprobs_ = max; }
  int max_device_logprobs() const override { return device_logprobs_; }
  // Steps that were asked for the logits.
  size_t n_logit_steps() const { return n_logit_steps_; }

  // Mixed steps (Backend::decode_mixed): with n > 0 the fake takes up to n prompt tokens a step,
  // logs 'm', records each step's piece sizes and runs the default (prefill each piece, decode).
  void set_mixed_prompt_rows(int n) { mixed_rows_ = n; }
  int max_mixed_prompt_rows() const override { return mixed_rows_; }
  void decode_mixed(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs, bool want_logits,
                    DecodeResult& result) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      log_.push_back('m');
      std::vector<std::pair<int64_t, int>> step;
      int total = 0;
      for (const SeqChunk& c : prompts) {
        MD_CHECK(!c.tokens.empty(), "fake backend: an empty prompt piece");
        for (const DecodeSeq& d : seqs) MD_CHECK(d.chunk.seq_id != c.seq_id, "fake backend: a piece of a decoding sequence");
        step.push_back({c.seq_id, static_cast<int>(c.tokens.size())});
        total += static_cast<int>(c.tokens.size());
      }
      MD_CHECK(total <= mixed_rows_, "fake backend: ", total, " prompt tokens in a mixed step, the most is ", mixed_rows_);
      mixed_steps_.push_back(std::move(step));
    }
    Backend::decode_mixed(prompts, seqs, want_logits, result);
  }
  // Each mixed step's pieces, (sequence, tokens), in call order.
  std::vector<std::vector<std::pair<int64_t, int>>> mixed_steps() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return mixed_steps_;
  }

  std::string call_log() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return log_;
  }
  size_t n_prefill_tokens() const { return n_prefill_tokens_; }
  // The sequence of every prefill call, in call order.
  std::vector<int64_t> prefill_seqs() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return prefill_seqs_;
  }
  size_t max_batch() const { return max_batch_; }
  // Rows sampled under a token mask (DecodeSeq::allowed), all steps together.
  size_t n_masked_rows() const { return n_masked_rows_; }
  // A chunk containing this token makes prefill/decode throw (error-path tests).
  void fail_on_token(int32_t token) { fail_token_ = token; }
  // From now on every prefill/decode call throws (a device that died): an Error, or with
  // device_error the typed error a CUDA backend's CUDA_CHECK throws for a sticky fault.
  void fail_every_call(bool device_error = false) {
    device_error_ = device_error;
    fail_all_ = true;
  }
  // Slows every call down (load tests: keeps many streams open at once).
  void set_delay_us(int us) { delay_us_ = us; }
  // While closed, every prefill/decode call waits (nothing finishes).
  void close_gate() {
    std::lock_guard<std::mutex> lock(gate_mutex_);
    gate_closed_ = true;
  }
  void open_gate() {
    {
      std::lock_guard<std::mutex> lock(gate_mutex_);
      gate_closed_ = false;
    }
    gate_cv_.notify_all();
  }

 protected:  // the slot store and the lock, for test backends built on this one
  static constexpr int64_t kPoison = -1;
  void pause() {
    if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_.load()));
    std::unique_lock<std::mutex> lock(gate_mutex_);
    gate_cv_.wait(lock, [&] { return !gate_closed_; });
  }
  void maybe_fail(std::span<const int32_t> tokens) {
    if (fail_all_ && device_error_)
      throw DeviceError(700, "cudaErrorIllegalAddress", "an illegal memory access was encountered",
                        "cudaStreamSynchronize(stream_)", "fakes.h", 1, true);
    if (fail_all_) throw Error("fake backend: injected device failure");
    if (std::find(tokens.begin(), tokens.end(), fail_token_.load()) != tokens.end())
      throw Error("fake backend: injected failure");
  }
  size_t slot(const SeqChunk& c, int pos) const {
    const size_t logical = static_cast<size_t>(pos / block_size_);
    MD_REQUIRE(logical < c.block_table.size(), "fake backend: position ", pos, " beyond the block table");
    const int32_t block = c.block_table[logical];
    MD_REQUIRE(block >= 0 && block < n_blocks_, "fake backend: block id ", block);
    return static_cast<size_t>(block) * block_size_ + pos % block_size_;
  }
  void write(const SeqChunk& c, int pos, int32_t token) { slots_[slot(c, pos)] = (static_cast<int64_t>(pos) << 32) | token; }
  std::vector<int32_t> read(const SeqChunk& c, int n) const {
    std::vector<int32_t> h(n);
    for (int pos = 0; pos < n; ++pos) {
      const int64_t v = slots_[slot(c, pos)];
      MD_REQUIRE(v != kPoison && (v >> 32) == pos, "fake backend: sequence ", c.seq_id, " reads position ", pos,
                 " from a slot holding ", v == kPoison ? std::string("nothing") : std::to_string(v >> 32));
      h[pos] = static_cast<int32_t>(v & 0xffffffff);
    }
    return h;
  }

  ModelConfig config_;
  mutable std::mutex mutex_;

 private:
  int n_blocks_;
  int block_size_;
  std::vector<int64_t> slots_;  // [n_blocks * block_size] (position << 32) | token
  std::string log_;  // 'p' per prefill call, 'd' per decode call, 'm' per mixed step (then its p's and d)
  int mixed_rows_ = 0;
  std::vector<std::vector<std::pair<int64_t, int>>> mixed_steps_;
  size_t n_prefill_tokens_ = 0;
  int device_logprobs_ = -1;
  std::atomic<size_t> n_logit_steps_{0};
  std::vector<int64_t> prefill_seqs_;
  size_t max_batch_ = 0;
  size_t n_masked_rows_ = 0;
  std::atomic<int32_t> fail_token_{-1};
  std::atomic<bool> fail_all_{false};
  std::atomic<bool> device_error_{false};
  std::atomic<int> delay_us_{0};
  std::mutex gate_mutex_;
  std::condition_variable gate_cv_;
  bool gate_closed_ = false;
};

// FakeBackend with asynchronous decode steps that run late, as on one GPU stream: decode_async()
// only queues a copy of the step (its spans need not outlive the call); collect(), and prefill()
// before it writes, run the queued steps in launch order. A chained row (prev_row) takes the token
// the step before it sampled, when it runs. So the engine can count neither on a step having run
// at launch nor on its inputs living on; and a block freed while a step that writes it is queued,
// then given to a prefill, would be overwritten after the prefill (the fake's reads then fail).
class DeferredFakeBackend : public FakeBackend {
 public:
  using FakeBackend::FakeBackend;
  std::string name() const override { return "deferred-fake"; }
  bool runs_async() const override { return true; }

  DecodeTicket decode_async(std::span<const DecodeSeq> seqs, bool want_logits) override {
    Queued q;
    q.id = next_ticket_++;
    q.want_logits = want_logits;
    for (const DecodeSeq& d : seqs) {
      Row r;
      r.seq = d;
      r.token = d.prev_row >= 0 ? -1 : d.chunk.tokens[0];
      r.table.assign(d.chunk.block_table.begin(), d.chunk.block_table.end());
      r.history.assign(d.history.begin(), d.history.end());
      r.allowed.assign(d.allowed.begin(), d.allowed.end());
      q.rows.push_back(std::move(r));
    }
    queue_.push_back(std::move(q));
    max_in_flight_ = std::max(max_in_flight_, queue_.size() + done_.size());
    return DecodeTicket{queue_.back().id, {}};
  }
  void collect(DecodeTicket ticket, DecodeResult& result) override {
    run_until(ticket.id);
    MD_REQUIRE(!done_.empty() && done_.front().first == ticket.id, "deferred fake: ticket ", ticket.id,
               " collected out of order");
    result = std::move(done_.front().second);
    done_.pop_front();
  }
  void prefill(const SeqChunk& chunk, std::span<float> last_logits) override {
    run_until(~uint64_t{0});
    FakeBackend::prefill(chunk, last_logits);
  }
  size_t max_in_flight() const { return max_in_flight_; }

 private:
  struct Row {
    DecodeSeq seq;
    int32_t token;
    std::vector<int32_t> table, history;
    std::vector<uint32_t> allowed;
  };
  struct Queued {
    uint64_t id;
    bool want_logits;
    std::vector<Row> rows;
  };
  void run_until(uint64_t id) {
    while (!queue_.empty() && queue_.front().id <= id) {
      Queued q = std::move(queue_.front());
      queue_.pop_front();
      std::vector<DecodeSeq> seqs;
      for (Row& r : q.rows) {
        if (r.seq.prev_row >= 0) {
          MD_REQUIRE(static_cast<size_t>(r.seq.prev_row) < last_tokens_.size(), "deferred fake: bad prev_row");
          r.token = last_tokens_[r.seq.prev_row];
        }
        DecodeSeq d = r.seq;
        d.prev_row = -1;
        d.chunk.tokens = std::span<const int32_t>(&r.token, 1);
        d.chunk.block_table = r.table;
        d.history = r.history;
        d.allowed = r.allowed;
        seqs.push_back(d);
      }
      DecodeResult result;
      FakeBackend::decode(seqs, q.want_logits, result);
      last_tokens_ = result.tokens;
      done_.emplace_back(q.id, std::move(result));
    }
  }
  uint64_t next_ticket_ = 1;
  std::deque<Queued> queue_;
  std::deque<std::pair<uint64_t, DecodeResult>> done_;
  std::vector<int32_t> last_tokens_;
  size_t max_in_flight_ = 0;
};

// Bytes 0..255 are themselves; 256.. are specials. Releases text only at UTF-8 boundaries.
class FakeDecoder : public TextDecoder {
 public:
  explicit FakeDecoder(bool skip_special) : skip_special_(skip_special) {}
  std::string push(int32_t t) override {
    if (t >= 256) {
      if (!skip_special_) bytes_ += fake_special_text(t);
    } else {
      bytes_ += static_cast<char>(t);
    }
    size_t cut = complete_prefix();
    std::string out = bytes_.substr(0, cut);
    bytes_.erase(0, cut);
    return out;
  }
  std::string flush() override {
    std::string out;
    out.swap(bytes_);
    return out;
  }

 private:
  // Length of the prefix that does not end inside an incomplete UTF-8 sequence.
  size_t complete_prefix() const {
    size_t n = bytes_.size();
    for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
      unsigned char c = static_cast<unsigned char>(bytes_[n - back]);
      if ((c & 0xC0) == 0x80) continue;  // continuation: keep looking for the lead byte
      size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
      return len > back ? n - back : n;
    }
    return n;
  }
  bool skip_special_;
  std::string bytes_;
};

inline TextDecoderFactory fake_decoders() {
  return [](bool skip) { return std::make_unique<FakeDecoder>(skip); };
}

inline std::string fake_text(std::span<const int32_t> tokens, bool skip_special = true) {
  FakeDecoder d(skip_special);
  std::string s;
  for (int32_t t : tokens) s += d.push(t);
  return s + d.flush();
}

// Polls done() until it holds (true) or the timeout passes (false).
template <typename F>
bool wait_until(F done, std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Collects every event, thread-safe.
class CollectingSink : public OutputSink {
 public:
  void on_output(SeqOutput&& o) override {
    std::lock_guard<std::mutex> lock(mutex);
    events.push_back(std::move(o));
  }
  std::mutex mutex;
  std::vector<SeqOutput> events;
};

}  // namespace megadecode::testing
