// The megakernel's in-CTA work record: what the producer (warp 8, lane 0) hands to the consumer
// warps through a small ring in shared memory, one record per static task or per claimed queue
// item. GEMM records describe the pages the consumers will find in the page ring, in order.
#pragma once

#include <cstdint>

namespace megadecode::cuda::mk {

enum WorkKind : int32_t {
  kWorkEnd = -1,    // the SM's list is done
  kWorkAbort = -2,  // the step failed: leave now
};

struct Work {
  int32_t op;  // Op, or a WorkKind
  int32_t layer;
  int32_t task;  // plan task index (for errors)
  int32_t n_arrives;
  int32_t arrive_counter[2];
  int32_t arrive_amount[2];
  int32_t arg[4];  // the task's args, or the item's fields
  // GEMM geometry (pages: ceil((rb_end-rb_begin)/kMT) chunks x ceil(n_kb/kStageKB) stages)
  int32_t rb_begin, rb_end;  // 16-row blocks of the weight matrix
  int32_t n_kb;              // 16-wide k blocks read
  int32_t n_tokens;
  int32_t row_end;     // rows >= row_end are not stored
  int32_t y_stride;    // elements per output row (token)
  int32_t y_tok_base;  // output row of token 0 (expert slots)
  int32_t pad;
  void* y;  // output base
};
static_assert(sizeof(Work) == 88);

}  // namespace megadecode::cuda::mk
