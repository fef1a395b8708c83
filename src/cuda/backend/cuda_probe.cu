// CudaProbe (see cuda_probe.h): each hook forwarded to the step that owns the state.
#include "cuda/backend/cuda_probe.h"

#include "core/check.h"
#include "cuda/backend/cuda_backend.h"
#include "cuda/common/kernel_marks.h"

namespace megadecode::cuda {

MegakernelStep& CudaProbe::megakernel() const {
  MD_REQUIRE(be_.megakernel_ != nullptr, be_.name(), " has no megakernel step");
  return *be_.megakernel_;
}

std::vector<float> CudaProbe::time_last_step(int warmup, int reps) {
  if (be_.last_path_ == DecodePath::kBatched) return be_.batched_->time_last_step(warmup, reps, be_.stream_);
  return megakernel().time_last_step(warmup, reps, be_.stream_);
}

std::vector<std::pair<std::string, double>> CudaProbe::profile_last_step() {
  if (be_.last_path_ != DecodePath::kBatched) return {};
  return be_.batched_->profile_last_step(be_.stream_);
}

std::vector<std::pair<std::string, double>> CudaProbe::profile_prefill(const SeqChunk& chunk) {
  MD_REQUIRE(be_.prefill_ != nullptr, "profile_prefill: this backend has no prefill runner (prefill chunk 0)");
  KernelMarks marks(be_.stream_);
  be_.prefill_->set_kernel_marks(&marks);
  try {
    be_.prefill(chunk, {});
  } catch (...) {
    be_.prefill_->set_kernel_marks(nullptr);
    throw;
  }
  be_.prefill_->set_kernel_marks(nullptr);
  return marks.collect();
}

void CudaProbe::enable_trace(int capacity_per_sm) { megakernel().enable_trace(capacity_per_sm, be_.stream_); }

std::vector<TraceRecord> CudaProbe::read_trace(int64_t* dropped) const {
  return megakernel().read_trace(dropped, be_.stream_);
}

const Plan& CudaProbe::last_plan() const { return megakernel().last_plan(); }

std::string CudaProbe::check_counter_totals() const { return megakernel().check_counter_totals(); }

void CudaProbe::set_poison_activations(bool on) {
  if (be_.megakernel_) be_.megakernel_->set_poison(on);
  if (be_.batched_) be_.batched_->set_poison(on);
}

void CudaProbe::set_stuck_task(int task) { megakernel().set_stuck_task(task); }

}  // namespace megadecode::cuda
