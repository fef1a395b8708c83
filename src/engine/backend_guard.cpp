// BackendGuard (see backend_guard.h).
#include "engine/backend_guard.h"

#include "core/check.h"

namespace megadecode {

template <class Call>
void BackendGuard::guarded(const char* what, Call&& call) {
  if (failed_) throw Error(cat("backend ", inner_.name(), " failed earlier: ", failure()));
  try {
    call();
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      failure_ = cat("backend ", inner_.name(), " ", what, " failed: ", e.what());
    }
    failed_ = true;
    throw;
  }
}

void BackendGuard::prefill(const SeqChunk& chunk, std::span<float> last_logits) {
  guarded("prefill", [&] { inner_.prefill(chunk, last_logits); });
}

void BackendGuard::decode(std::span<const DecodeSeq> seqs, bool want_logits, DecodeResult& result) {
  guarded("decode step", [&] { inner_.decode(seqs, want_logits, result); });
}

void BackendGuard::decode_mixed(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs, bool want_logits,
                                DecodeResult& result) {
  guarded("mixed step", [&] { inner_.decode_mixed(prompts, seqs, want_logits, result); });
}

DecodeTicket BackendGuard::decode_async(std::span<const DecodeSeq> seqs, bool want_logits) {
  DecodeTicket ticket;
  guarded("decode step", [&] { ticket = inner_.decode_async(seqs, want_logits); });
  return ticket;
}

DecodeTicket BackendGuard::decode_async_mixed(std::span<const SeqChunk> prompts, std::span<const DecodeSeq> seqs,
                                              bool want_logits) {
  DecodeTicket ticket;
  guarded("mixed step", [&] { ticket = inner_.decode_async_mixed(prompts, seqs, want_logits); });
  return ticket;
}

void BackendGuard::collect(DecodeTicket ticket, DecodeResult& result) {
  guarded("decode step", [&] { inner_.collect(ticket, result); });
}

std::string BackendGuard::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

}  // namespace megadecode
