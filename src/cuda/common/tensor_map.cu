#include "cuda/common/tensor_map.h"

#include <mutex>

#include <cuda_runtime_api.h>

#include "core/check.h"
#include "cuda/common/cuda_check.h"

namespace megadecode::cuda {

namespace {
CUtensorMap encode_map(const void* base, int rank, const uint64_t* dims, const uint64_t* strides_bytes,
                       const uint32_t* box, CUtensorMapSwizzle swizzle, const char* what) {
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Encode encode = nullptr;
  static std::once_flag found;
  std::call_once(found, [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    MD_CHECK(q == cudaDriverEntryPointSuccess && fn != nullptr, "the driver has no cuTensorMapEncodeTiled");
    encode = reinterpret_cast<Encode>(fn);
  });
  cuuint64_t d[4], s[3];
  cuuint32_t b[4], e[4] = {1, 1, 1, 1};
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    if (i + 1 < rank) s[i] = strides_bytes[i];
  }
  CUtensorMap map{};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, static_cast<cuuint32_t>(rank), const_cast<void*>(base),
                            d, s, b, e, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MD_CHECK(r == CUDA_SUCCESS, what, ": cuTensorMapEncodeTiled failed (", static_cast<int>(r), ") for dims [", dims[0],
           ", ", dims[1], rank > 2 ? ", " : "", rank > 2 ? std::to_string(dims[2]) : std::string(), "]");
  return map;
}
}  // namespace

CUtensorMap bf16_tensor_map_sw128(const void* base, int rank, const uint64_t* dims, const uint64_t* strides_bytes,
                                  const uint32_t* box, const char* what) {
  MD_REQUIRE(rank >= 2 && rank <= 3 && box[0] * 2 <= 128, what, ": a rank-", rank, " map with ", box[0],
             "-element boxes (128-byte swizzle)");
  return encode_map(base, rank, dims, strides_bytes, box, CU_TENSOR_MAP_SWIZZLE_128B, what);
}
CUtensorMap bf16_tensor_map_plain(const void* base, int rank, const uint64_t* dims, const uint64_t* strides_bytes,
                                  const uint32_t* box, const char* what) {
  MD_REQUIRE(rank >= 2 && rank <= 4 && box[0] * 2 % 16 == 0, what, ": a rank-", rank, " map with ", box[0],
             "-element boxes");
  return encode_map(base, rank, dims, strides_bytes, box, CU_TENSOR_MAP_SWIZZLE_NONE, what);
}

}  // namespace megadecode::cuda
