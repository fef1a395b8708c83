// TMA tensor maps of bf16 tensors (cuTensorMapEncodeTiled, reached through the runtime's driver
// entry point, so nothing links against the driver library by name). A map is a kernel parameter
// (`const __grid_constant__ CUtensorMap`); the kernels load boxes of it with ptx::tma_load_2d/3d.
#pragma once

#include <cstdint>

#include <cuda.h>

namespace megadecode::cuda {

// A map of a row-major bf16 tensor of `rank` (2 or 3) dimensions, innermost first: dims[i]
// elements, strides_bytes[i] the byte pitch of dimension i + 1 (multiples of 16), boxes of box[i]
// elements with a 128-byte swizzle (box[0] * 2 <= 128). Elements outside the tensor read as
// zeros. `what` names the tensor in the error a bad shape gives.
CUtensorMap bf16_tensor_map_sw128(const void* base, int rank, const uint64_t* dims, const uint64_t* strides_bytes,
                                  const uint32_t* box, const char* what);
// The same without swizzle, rank 2..4 (box[0] * 2 a multiple of 16).
CUtensorMap bf16_tensor_map_plain(const void* base, int rank, const uint64_t* dims, const uint64_t* strides_bytes,
                                  const uint32_t* box, const char* what);

}  // namespace megadecode::cuda
