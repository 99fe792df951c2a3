#include "kernels/tf/op_util.h"

#include <algorithm>
#include <limits>
#include <string>

#include "kernels/tf/huge_pages.h"
#include "kernels/tf/parallel_run.h"
#include "kernels/tf/table_format.h"
#include "tensorflow/core/framework/bounds_check.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/util/overflow.h"
#include "tensorflow/core/util/util.h"

namespace tfce {

using ::tensorflow::Tensor;

namespace {

template <typename Index>
absl::Status FirstBadId(const Tensor& ids, int64_t rows,
                        const Tensor* segment_ids) {
  const auto flat = ids.flat<Index>();
  for (int64_t i = 0; i < flat.size(); ++i) {
    const int64_t id = tensorflow::internal::SubtleMustCopy(flat(i));
    if (tensorflow::FastBoundsCheck(id, rows)) continue;
    std::string segment;
    if (segment_ids != nullptr) {
      segment = absl::StrCat(" (in segment ", IntAt(*segment_ids, i), ")");
    }
    return InvalidArgument("ids", tensorflow::SliceDebugString(ids.shape(), i),
                           " = ", id, segment, " is not in [0, ", rows,
                           "): the table has ", rows, " rows");
  }
  return absl::OkStatus();
}

}  // namespace

int64_t IntAt(const Tensor& t, int64_t i) {
  return t.dtype() == tensorflow::DT_INT32 ? int64_t{t.flat<int32_t>()(i)}
                                           : t.flat<int64_t>()(i);
}

int64_t IntScalar(const Tensor& t) {
  return t.dtype() == tensorflow::DT_INT32 ? int64_t{t.scalar<int32_t>()()}
                                           : t.scalar<int64_t>()();
}

absl::Status CheckIds(const Tensor& ids, int64_t rows,
                      const Tensor* segment_ids) {
  return ids.dtype() == tensorflow::DT_INT32
             ? FirstBadId<int32_t>(ids, rows, segment_ids)
             : FirstBadId<int64_t>(ids, rows, segment_ids);
}

absl::Status BadIdError(const Tensor& ids, int64_t rows,
                        const Tensor* segment_ids) {
  absl::Status status = CheckIds(ids, rows, segment_ids);
  if (!status.ok()) return status;
  // The kernel saw a bad id that is gone now: the ids changed under us.
  return absl::InternalError("ids changed while the op was reading them");
}

absl::Status GetKernelVariant(const KernelVariant** variant) {
  std::string error;
  *variant = SelectedVariant(&error);
  if (*variant == nullptr) return absl::InvalidArgumentError(error);
  return absl::OkStatus();
}

CompressedTableOp::CompressedTableOp(tensorflow::OpKernelConstruction* ctx)
    : OpKernel(ctx) {
  OP_REQUIRES_OK(ctx, GetKernelVariant(&variant_));
  std::string row_format;
  tensorflow::DataType dtype;
  OP_REQUIRES_OK(ctx, ctx->GetAttr("row_format", &row_format));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &dtype));
  OP_REQUIRES_OK(ctx, ParseTableFormat(dtype, row_format, dim_, &storage_));
  OP_REQUIRES_OK(ctx, ReadMaxThreads(ctx, &max_threads_));
}

absl::Status CompressedTableOp::ReadTable(tensorflow::OpKernelContext* ctx,
                                          TableView* view) const {
  TF_RETURN_IF_ERROR(
      MakeTableView(ctx->input(0), ctx->input(1), storage_, dim_, view));
  AdviseHugePages(*view);
  return absl::OkStatus();
}

absl::Status OutputShape(const tensorflow::TensorShape& outer, int64_t dim,
                         const char* inputs, tensorflow::TensorShape* shape) {
  // Checked here, not left to AddDimWithStatus, whose overflow message
  // names no input.
  if (tensorflow::MultiplyWithoutOverflow(outer.num_elements(), dim) < 0) {
    return InvalidArgument("the output shape ", outer.DebugString(), " + [",
                           dim,
                           "] has more elements than int64 can count: ", inputs,
                           " or the table's dim is too large");
  }
  *shape = outer;
  return shape->AddDimWithStatus(dim);
}

}  // namespace tfce
