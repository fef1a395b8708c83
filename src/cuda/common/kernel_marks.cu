#include "cuda/common/kernel_marks.h"

#include <algorithm>

#include "cuda/common/cuda_check.h"

namespace megadecode::cuda {

KernelMarks::KernelMarks(cudaStream_t stream) : stream_(stream) {
  CUDA_CHECK(cudaEventCreate(&start_));
  CUDA_CHECK(cudaEventRecord(start_, stream_));
}

KernelMarks::~KernelMarks() {
  for (const auto& m : marks_) CUDA_CHECK_NOTHROW(cudaEventDestroy(m.second));
  CUDA_CHECK_NOTHROW(cudaEventDestroy(start_));
}

void KernelMarks::mark(const char* name) {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreate(&e));
  marks_.push_back({name, e});
  CUDA_CHECK(cudaEventRecord(e, stream_));
}

std::vector<std::pair<std::string, double>> KernelMarks::collect() {
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<std::pair<std::string, double>> out;
  cudaEvent_t prev = start_;
  for (const auto& [name, e] : marks_) {
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, prev, e));
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& x) { return x.first == name; });
    if (it == out.end()) out.push_back({name, ms});
    else it->second += ms;
    prev = e;
  }
  return out;
}

}  // namespace megadecode::cuda
