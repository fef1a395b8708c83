// What the engine is asked to do and what it answers: one SequenceRequest per generated sequence
// (an API request with n choices submits n of them under one request_id), and a stream of
// SeqOutput events per sequence, the last one with `finished` set.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/token_constraint.h"
#include "sampling/params.h"

namespace megadecode {

using Clock = std::chrono::steady_clock;

enum class FinishReason { kStop, kLength, kAbort, kError };
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "abort", "error"

// When a sequence ends (vLLM semantics).
struct StopConditions {
  int max_tokens = 16;                  // generated tokens at most (>= 1)
  int min_tokens = 0;                   // eos / stop_token_ids are not honoured before this many
  std::vector<std::string> stop;        // stop strings; the match is cut from the text
  std::vector<int32_t> stop_token_ids;  // end the sequence; their text is not output
  std::vector<int32_t> eos_token_ids;   // the model's end tokens (ignored with ignore_eos)
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
};

struct TopLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// The log-probability (of the raw model distribution) of one token and the top alternatives.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<TopLogprob> top;  // most likely first
};

struct SeqOutput {
  uint64_t request_id = 0;
  int index = 0;                        // choice index within the request
  std::vector<int32_t> tokens;          // tokens generated since the last event
  std::string text;                     // text released since the last event (stop strings held back)
  std::vector<TokenLogprob> logprobs;   // one per token, when asked for
  // On the first event of a sequence that asked for prompt logprobs: one per prompt token (the
  // first has none).
  std::optional<std::vector<std::optional<TokenLogprob>>> prompt_logprobs;

  bool finished = false;
  FinishReason finish_reason = FinishReason::kStop;
  std::optional<std::string> stop_string;  // the stop string that ended it
  std::optional<int32_t> stop_token;       // the stop_token_ids entry that ended it
  std::string error;                       // with kError
  int n_prompt_tokens = 0;                 // filled on every event
  int n_cached_tokens = 0;                 // prompt tokens served from the prefix cache
  int n_completion_tokens = 0;             // generated so far
};

// Receives a sequence's events. Called on the engine's scheduler thread: must not block (post the
// work elsewhere). After the event with `finished`, no more calls for that sequence.
class OutputSink {
 public:
  virtual ~OutputSink() = default;
  virtual void on_output(SeqOutput&& output) = 0;
};

// Incremental detokenization: fed one token at a time, returns text that became complete.
class TextDecoder {
 public:
  virtual ~TextDecoder() = default;
  virtual std::string push(int32_t token) = 0;
  virtual std::string flush() = 0;
};
using TextDecoderFactory = std::function<std::unique_ptr<TextDecoder>(bool skip_special_tokens)>;

struct SequenceRequest {
  uint64_t request_id = 0;
  int index = 0;
  std::vector<int32_t> prompt;  // non-empty
  SamplingParams sampling;
  StopConditions stop;
  int logprobs = -1;            // -1: none; k >= 0: the sampled token's logprob and the top k
  bool prompt_logprobs = false;  // also the prompt's logprobs (echo with logprobs); top `logprobs`
  Clock::time_point arrival = Clock::now();
  std::shared_ptr<OutputSink> sink;
  // Structured output: the tokens this sequence may generate (null: any). One object per sequence.
  std::shared_ptr<TokenConstraint> constraint;
};

}  // namespace megadecode
