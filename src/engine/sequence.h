// The scheduler's record of one sequence (private to scheduler.cpp and scheduler_decode.cpp).
#pragma once

#include <chrono>
#include <optional>
#include <vector>

#include "engine/scheduler.h"

namespace megadecode {

struct Scheduler::Sequence {
  Sequence(int64_t seq_id, SequenceRequest&& r, std::unique_ptr<TextDecoder> decoder)
      : id(seq_id), req(std::move(r)), tokens(req.prompt), n_prompt(static_cast<int>(req.prompt.size())),
        out(req.stop, std::move(decoder)) {
    for (int32_t t : req.stop.stop_token_ids) banned.push_back(t);
    if (!req.stop.ignore_eos)
      for (int32_t t : req.stop.eos_token_ids) banned.push_back(t);
    if (req.prompt_logprobs) prompt_lp.assign(n_prompt, std::nullopt);
  }
  int64_t id;
  SequenceRequest req;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int n_prompt;
  int n_computed = 0;  // tokens whose KV is written; the last token is always uncomputed
  int n_cached = 0;    // prompt tokens served from the prefix cache at the first admission
  bool admitted_once = false;
  bool started = false;  // a step has computed any of its tokens (queue time ends, prefill time starts)
  Clock::time_point start_time;
  bool first_token_done = false;
  bool ended = false;   // its last event is sent: tokens of steps still in flight are discarded
  int n_in_flight = 0;  // launched steps holding a row of it, not yet processed
  OutputProcessor out;
  std::vector<int32_t> banned;  // end tokens, kept from sampling before min_tokens
  // With a constraint (req.constraint): the tokens its next step may sample, filled by fill_mask()
  // before each step that samples for it ([token_mask_words(vocab)] words; DecodeSeq::allowed).
  std::vector<uint32_t> mask;
  std::vector<std::optional<TokenLogprob>> prompt_lp;  // [n_prompt] with prompt_logprobs
  Clock::time_point last_token_time;
  Clock::time_point first_token_time;  // set with first_token_done

  // The first step that computes any of its tokens: its queue time (arrival to now) is observed.
  void start(EngineMetrics* metrics) {
    if (started) return;
    started = true;
    start_time = Clock::now();
    if (metrics != nullptr)
      metrics->request_queue_time.observe(std::chrono::duration<double>(start_time - req.arrival).count());
  }
  bool ready_to_decode() const { return n_computed == static_cast<int>(tokens.size()) - 1; }
  bool has_penalties() const { return req.sampling.has_penalties(); }
  bool constrained() const { return req.constraint != nullptr; }
  // Whether the token the backend samples next may be replaced on the host (min_tokens bans).
  bool host_may_resample() const { return out.end_tokens_banned() && !banned.empty(); }
};

}  // namespace megadecode
