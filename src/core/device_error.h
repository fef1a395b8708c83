// DeviceError: a failed device API call (cuda/common/cuda_check.h's CUDA_CHECK throws it). It
// carries the API's error code and names, the failing expression, file:line, and whether the error
// is sticky (the device context is unusable after it: an illegal address, a launch failure, an
// uncorrectable ECC error...). Kept free of CUDA headers so CPU code and tests can throw and catch
// it. The engine treats every backend exception alike (engine/backend_guard.h: the failure is final,
// requests end with an error, the process exits 1); `sticky` tells the log what happened.
#pragma once

#include <string>

#include "core/check.h"

namespace megadecode {

class DeviceError : public Error {
 public:
  // code: the API's numeric error (cudaError_t); name: its symbol (cudaErrorIllegalAddress);
  // description: the API's string for it.
  DeviceError(int code, std::string name, const std::string& description, std::string expression, std::string file,
              int line, bool sticky)
      : Error(cat("device error ", name, " (", code, ": ", description, ") in ", expression, " at ", file, ":", line,
                  sticky ? "; the device context is lost" : "")),
        code_(code),
        name_(std::move(name)),
        expression_(std::move(expression)),
        file_(std::move(file)),
        line_(line),
        sticky_(sticky) {}

  int code() const { return code_; }
  const std::string& error_name() const { return name_; }
  const std::string& expression() const { return expression_; }
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  bool sticky() const { return sticky_; }

 private:
  int code_;
  std::string name_, expression_, file_;
  int line_;
  bool sticky_;
};

}  // namespace megadecode
