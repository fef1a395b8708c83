// The continuous-batching scheduler (DESIGN §6). One iteration, step():
//   1. admit waiting sequences (FIFO) while a slot and their prompt's KV blocks are free, reusing
//      prefix-cached blocks;
//   2. prefill at most max_prefill_tokens prompt tokens (chunked across iterations), so running
//      sequences keep decoding between the chunks of a long prompt. With mixed steps (a backend
//      whose max_mixed_prompt_rows() > 0, and config.mixed_steps), first come, first served also
//      holds between a prompt and the streams: a prompt that arrived while a stream was already
//      generating (that stream's first token came before the prompt's arrival) may not stall it,
//      so it rides in the decode steps (Backend::decode_async_mixed), as many tokens a step as
//      PromptShare allows (the step stays within mixed_itl_ratio x a step without prompt tokens);
//      a prompt that arrived before every stream's first token (a burst of requests), and one that
//      wants prompt logprobs, is prefilled in separate calls at the full budget;
//   3. decode every sequence whose prompt is in: one token each, in one backend call; a sequence
//      that needs a new block when none is free preempts the newest running sequence (its blocks
//      are freed; it waits again at the front and recomputes its tokens when readmitted).
// A prompt's last token always goes through decode, so the backend does all sampling.
// Finished, aborted and failed sequences free their blocks at once.
//
// Token constraints (SequenceRequest::constraint, structured output): before each step that samples
// for a constrained sequence its constraint fills the sequence's mask (DecodeSeq::allowed); the
// sampled token goes to accept() (refused: the backend sampled outside the mask, the sequence ends
// with an error naming it), and a finished() constraint ends the sequence with "stop". An end token
// the mask allows ends it as usual; before min_tokens the end tokens are banned even where the mask
// allows them, unless it allows nothing else (then the end token ends the sequence: no hang).
//
// Overlap: when the batch stays as it is, an iteration launches step N+1 before it
// processes step N's tokens, so the host's work for one step runs while the device runs the other.
// Step N+1's rows take their input tokens from step N on the backend's side (DecodeSeq::prev_row).
// A sequence that stops at step N (end token, max_tokens, stop string) or is aborted has its
// step-N+1 token discarded: never sent, never counted. The batch "stays" when no sequence ended,
// nothing waits that could be admitted, no prompt is being prefilled, every row has its next block,
// and no row needs the host to pick its token (penalties, end tokens banned before min_tokens) or
// its mask (a constrained row: its mask follows the token step N samples).
// Threading: single-threaded; the Engine's scheduler thread owns it (tests drive it directly).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/metrics.h"
#include "engine/output_processor.h"
#include "engine/prompt_share.h"
#include "engine/request.h"
#include "engine/step_times.h"
#include "kv/kv_cache.h"

namespace megadecode {

// When the scheduler launches step N+1 before it processes step N's tokens.
enum class Overlap {
  kOff,     // never: each step is launched, collected and processed in turn
  kAuto,    // with backends that decode asynchronously (Backend::runs_async)
  kAlways,  // with every backend (the synchronous defaults give the same tokens; tests use it)
};

struct SchedulerConfig {
  int max_num_seqs = 64;         // running sequences at most (the decode batch)
  int max_prefill_tokens = 256;  // prompt tokens prefilled per iteration
  bool prefix_caching = true;
  bool check_invariants = false;  // run the KV and scheduler checkers after every mutation
  Overlap overlap = Overlap::kAuto;
  bool log_steps = false;  // log one line per iteration that decoded (step_line)
  bool mixed_steps = true;  // prompt pieces ride in the decode step when the backend mixes them
  double mixed_itl_ratio = 1.6;  // PromptShare's bound: a mixed step's time over a plain step's
};

class Scheduler {
 public:
  Scheduler(Backend& backend, const SchedulerConfig& config, TextDecoderFactory decoders, EngineMetrics* metrics);
  ~Scheduler();

  // Queues a sequence at the back of the waiting queue. The request must be valid (Engine checks).
  void add(SequenceRequest request);
  // Ends every sequence of request_id (waiting or running) with finish reason abort.
  void abort(uint64_t request_id);
  // Ends every sequence with `reason` (shutdown).
  void abort_all(FinishReason reason, const std::string& message);

  // One iteration; false when there was nothing to do.
  bool step();
  bool idle() const { return waiting_.empty() && running_.empty() && !in_flight_; }
  int n_running() const { return static_cast<int>(running_.size()); }
  int n_waiting() const { return static_cast<int>(waiting_.size()); }
  const KvCache& kv() const { return kv_; }
  const SchedulerConfig& config() const { return config_; }
  uint64_t n_preemptions() const { return n_preemptions_; }
  // The last iteration's times (StepTimes); its `step` is the number of iterations so far.
  const StepTimes& last_step() const { return times_; }
  // Iterations that launched a step before processing the previous one's tokens.
  uint64_t n_chained() const { return n_chained_; }
  // The mixed steps' prompt-share estimates.
  const PromptShare& prompt_share() const { return prompt_share_; }

  // KV invariants plus: every running sequence holds a table, no waiting one does, and the
  // tables cover what was computed and what the step in flight writes.
  void check_invariants() const;

 private:
  struct Sequence;
  // A launched decode step whose tokens are not processed yet; rows[i] is row i.
  struct InFlight {
    DecodeTicket ticket;
    std::vector<Sequence*> rows;
    std::vector<std::pair<Sequence*, int>> pieces;  // a mixed step's prompt pieces: (sequence, tokens)
  };
  void admit();
  KvAdmission head_admission() const;
  void prefill();
  void decode();
  bool mixing() const;
  // The first-token time of the earliest running stream (nullopt: none has one yet).
  std::optional<Clock::time_point> oldest_stream() const;
  // Whether s's prompt rides in decode steps (a mixed step) rather than prefill calls: it arrived
  // while a stream was already generating (it may not stall that stream).
  bool rides_mixed(const Sequence& s, std::optional<Clock::time_point> oldest) const;
  // A mixed step's prompt pieces (first come, first served) for a step whose rows are `rows`.
  std::vector<std::pair<Sequence*, int>> prompt_pieces(const std::vector<Sequence*>& rows);
  void preempt(size_t running_index);
  void emit(Sequence& seq, OutputProcessor::Step&& step, std::vector<int32_t> tokens, std::vector<TokenLogprob> logprobs,
            const std::string& error = "");
  void finish_running(size_t running_index, FinishReason reason, const std::string& error);
  void end_sequence(Sequence& seq, FinishReason reason, const std::string& error);
  void publish_gauges();  // the metrics' gauges, after every change of the queues or the KV pool
  void remove_running(size_t running_index);
  size_t running_index(const Sequence& seq) const;
  void checkpoint() const {
    if (config_.check_invariants) check_invariants();
  }
  // The decode steps (scheduler_decode.cpp).
  bool overlapping() const;
  bool chain();
  std::optional<InFlight> launch(std::vector<Sequence*> rows, std::span<const DecodeSeq> seqs, bool want_logits,
                                 std::string& error, std::vector<std::pair<Sequence*, int>> pieces = {});
  void finish_in_flight();
  void complete(InFlight& step);
  void process(const InFlight& step, const DecodeResult& result);
  bool advance_constraint(Sequence& s, int32_t token, bool& ends, std::string& error);
  void release(const InFlight& step);
  void drain();

  Backend& backend_;
  SchedulerConfig config_;
  TextDecoderFactory decoders_;
  EngineMetrics* metrics_;
  KvCache kv_;
  int64_t next_seq_id_ = 1;
  uint64_t n_preemptions_ = 0;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order; preemption takes from the back
  std::vector<float> logits_;                       // [vocab] prompt-logprob scratch
  std::optional<InFlight> in_flight_;               // the step launched and not yet processed
  // Sequences that ended while a step in flight still holds a row of theirs (kept until then).
  std::vector<std::unique_ptr<Sequence>> retired_;
  StepTimes times_;
  uint64_t n_chained_ = 0;
  PromptShare prompt_share_;
};

}  // namespace megadecode
