// Per-kernel timing of one eager pass (benchmarks only): a CUDA event after each launch, the time
// from the previous event summed per name. Construct before the launches (records the start),
// mark(name) after each, collect() once after the last (it waits for the stream).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

namespace megadecode::cuda {

class KernelMarks {
 public:
  explicit KernelMarks(cudaStream_t stream);
  ~KernelMarks();
  KernelMarks(const KernelMarks&) = delete;
  KernelMarks& operator=(const KernelMarks&) = delete;

  void mark(const char* name);
  // Milliseconds per name, in first-seen order.
  std::vector<std::pair<std::string, double>> collect();

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr;
  std::vector<std::pair<const char*, cudaEvent_t>> marks_;
};

}  // namespace megadecode::cuda
