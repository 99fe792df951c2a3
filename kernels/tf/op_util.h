// Helpers shared by the OpKernels: reading the table inputs, turning a kernel's
// `false` into a precise error, kernel variant selection.
#ifndef TFCE_KERNELS_TF_OP_UTIL_H_
#define TFCE_KERNELS_TF_OP_UTIL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/dispatch.h"
#include "kernels/core/kernel_api.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tfce {

// absl::InvalidArgumentError with the message built like TF's errors::.
template <typename... Args>
absl::Status InvalidArgument(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

// Element i of an int32 or int64 vector, and the value of an int32 or int64
// scalar, as int64 (the dtype is the caller's to have checked).
int64_t IntAt(const tensorflow::Tensor& t, int64_t i);
int64_t IntScalar(const tensorflow::Tensor& t);

// Scans ids for the first id outside [0, rows) and returns an
// InvalidArgument naming its position, value and the valid range. The kernels
// check ids themselves; this runs only after a kernel returned false (so the
// fast path pays no extra pass), when no kernel runs (dim == 0), or before
// allocating an output above kValidateFirstElements.
// `segment_ids` (may be null) adds the segment of the bad id to the message.
absl::Status CheckIds(const tensorflow::Tensor& ids, int64_t rows,
                      const tensorflow::Tensor* segment_ids);

// CheckIds after a kernel reported a bad id: never returns OK.
absl::Status BadIdError(const tensorflow::Tensor& ids, int64_t rows,
                        const tensorflow::Tensor* segment_ids);

// Outputs of more elements than this are allocated only once ids (and segment
// ids) are known to be valid: a bad request must not cost that much memory,
// nor be reported as out of memory instead of naming the bad input.
constexpr int64_t kValidateFirstElements = int64_t{16} << 20;  // 64 MiB

// `outer` + [dim] as *shape, or an InvalidArgument naming `inputs` (the
// inputs that set the outer dims) when its element count overflows int64.
absl::Status OutputShape(const tensorflow::TensorShape& outer, int64_t dim,
                         const char* inputs, tensorflow::TensorShape* shape);

// The kernel variant chosen for this process (TFCE_ISA or CPU detection).
absl::Status GetKernelVariant(const KernelVariant** variant);

// Base of the OpKernels over a compressed table (inputs 0 and 1): the kernel
// variant, the table's storage format (attrs T, row_format, dim) and the
// thread cap (kMaxThreadsAttr), read at construction.
class CompressedTableOp : public tensorflow::OpKernel {
 public:
  explicit CompressedTableOp(tensorflow::OpKernelConstruction* ctx);

 protected:
  // Validates inputs 0 (table) and 1 (scales) into *view (MakeTableView,
  // table_format.h) and
  // advises huge pages for the table's buffers.
  absl::Status ReadTable(tensorflow::OpKernelContext* ctx,
                         TableView* view) const;

  const KernelVariant* variant_ = nullptr;
  Storage storage_ = Storage::kInt8Split;
  int64_t dim_ = -1;  // the dim attr: D of rowwise tables, -1 for 'plain'

  int64_t max_threads_ = 0;  // 0: all intra-op threads
};

}  // namespace tfce

#endif  // TFCE_KERNELS_TF_OP_UTIL_H_
