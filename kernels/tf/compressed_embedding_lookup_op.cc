// CompressedEmbeddingLookup: validate, allocate, run the selected kernel
// variant sharded, report a bad id.
#include <cstdint>

#include "kernels/core/dispatch.h"
#include "kernels/core/kernel_api.h"
#include "kernels/core/prefetch_policy.h"
#include "kernels/tf/op_util.h"
#include "kernels/tf/parallel_run.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tfce {
namespace {

class CompressedEmbeddingLookupOp : public CompressedTableOp {
 public:
  explicit CompressedEmbeddingLookupOp(tensorflow::OpKernelConstruction* ctx)
      : CompressedTableOp(ctx) {}

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const tensorflow::Tensor& ids = ctx->input(2);
    TableView view;
    OP_REQUIRES_OK(ctx, ReadTable(ctx, &view));

    tensorflow::TensorShape out_shape;
    OP_REQUIRES_OK(ctx, OutputShape(ids.shape(), view.dim, "ids", &out_shape));
    if (out_shape.num_elements() > kValidateFirstElements) {
      OP_REQUIRES_OK(ctx, CheckIds(ids, view.rows, nullptr));
    }
    tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out));
    const int64_t num_ids = ids.NumElements();
    if (num_ids == 0) return;
    if (view.dim == 0) {  // nothing to decode, but bad ids are still errors
      OP_REQUIRES_OK(ctx, CheckIds(ids, view.rows, nullptr));
      return;
    }

    LookupArgs args;
    args.table = view;
    args.ids = IdsView{ids.data(), ids.dtype() == tensorflow::DT_INT64};
    args.out = out->flat<float>().data();
    args.prefetch_rows = PrefetchRows();
    if (!RunKernelSharded(ctx, variant_->lookup, args, &LookupArgs::begin,
                          &LookupArgs::end, num_ids,
                          /*cost_per_unit=*/view.dim * 2 + 20, max_threads_)) {
      ctx->CtxFailure(BadIdError(ids, view.rows, nullptr));
    }
  }
};

REGISTER_KERNEL_BUILDER(
    Name("CompressedEmbeddingLookup").Device(tensorflow::DEVICE_CPU),
    CompressedEmbeddingLookupOp);

}  // namespace
}  // namespace tfce
