// Host entry point of the megakernel: picks the token-group instantiation for the batch, checks
// that the model's shape fits the kernel and that the whole grid can be resident (a persistent
// kernel whose CTAs are not all resident deadlocks), and launches it on a stream (graph-capturable).
#pragma once

#include <cstdint>
#include <span>

#include <cuda_runtime_api.h>

#include "cuda/megakernel/types.h"

namespace megadecode::cuda {

struct MkLaunchShape {
  int token_groups;  // kNT: tokens padded to 8 * kNT
  int page_slots;    // pages in the shared-memory ring
  int page_bytes;
  int smem_bytes;    // dynamic shared memory per CTA
  int act_bytes;     // the activation area of a GEMM job
};

// The launch shape for a batch (Error when the device cannot hold it).
MkLaunchShape megakernel_shape(int batch);

// Error naming the limit when the plan's shapes do not fit the kernel.
void check_megakernel_shape(const PlanShape& s);

// Error naming the op when one of `tasks` is an op the kernel does not run (megakernel_runs), or an
// ATTN task carries flags it does not implement (kAttnSliding; kAttnNoRope runs). The kernel stops on such a task too
// (kMkDetailUnknownOp), but the host check names it before anything is launched.
void check_megakernel_tasks(std::span<const Task> tasks);

// Launches grid = params.plan.shape.n_sms CTAs. Error when the grid cannot be fully resident.
void launch_megakernel(const MkParams& params, cudaStream_t stream);

}  // namespace megadecode::cuda
