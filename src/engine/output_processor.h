// Turns one sequence's sampled tokens into released text and a finish decision: end tokens
// (eos / stop_token_ids, honoured from min_tokens on), max_tokens, and stop strings, including
// ones split across tokens. Text that could still be the start of a stop string is held back, so
// a stop string never reaches the client.
// Threading: used by the engine's scheduler thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/request.h"

namespace megadecode {

class OutputProcessor {
 public:
  OutputProcessor(const StopConditions& stop, std::unique_ptr<TextDecoder> decoder);

  struct Step {
    std::string text;  // released by this token
    bool finished = false;
    FinishReason reason = FinishReason::kStop;
    std::optional<std::string> stop_string;
    std::optional<int32_t> stop_token;
  };
  // Takes the next generated token (the n-th, counting from 1). With `ends` (a token constraint that
  // is finished, or that allowed nothing but the end tokens) the sequence ends with this token
  // ("stop", the text so far is the output), before min_tokens too and ahead of max_tokens.
  Step push(int32_t token, bool ends = false);
  int n_generated() const { return n_generated_; }
  // Whether `token` may end the sequence now; the engine keeps such tokens from being sampled
  // before min_tokens.
  bool is_end_token(int32_t token) const;
  bool end_tokens_banned() const { return n_generated_ < stop_.min_tokens; }

 private:
  // Looks for a stop string in the held-back text; on a match cuts it and finishes `step`.
  bool match_stop(Step& step);
  void release(Step& step, bool all);

  StopConditions stop_;
  std::unique_ptr<TextDecoder> decoder_;
  size_t max_stop_bytes_ = 0;
  int n_generated_ = 0;
  std::string pending_;  // decoded, not yet released text
};

}  // namespace megadecode
