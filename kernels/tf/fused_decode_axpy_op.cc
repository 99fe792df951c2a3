// FusedDecodeAxpy: validate, build per-segment offsets, run the selected
// kernel variant sharded, report a bad id.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/core/batched_pool.h"
#include "kernels/core/dispatch.h"
#include "kernels/core/kernel_api.h"
#include "kernels/core/prefetch_policy.h"
#include "kernels/tf/bag_inputs.h"
#include "kernels/tf/op_util.h"
#include "kernels/tf/parallel_run.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tfce {
namespace {

using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

class FusedDecodeAxpyOp : public CompressedTableOp {
 public:
  explicit FusedDecodeAxpyOp(OpKernelConstruction* ctx)
      : CompressedTableOp(ctx) {
    std::string combiner;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiner", &combiner));
    OP_REQUIRES_OK(ctx, ParseCombiner(combiner, &combiner_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(2);
    const Tensor& segment_ids = ctx->input(3);
    const Tensor& weights = ctx->input(4);
    TableView view;
    OP_REQUIRES_OK(ctx, ReadTable(ctx, &view));
    OP_REQUIRES(ctx, ids.dims() == 1,
                InvalidArgument("ids must be a vector, but has shape ",
                                ids.shape().DebugString()));
    OP_REQUIRES(ctx, segment_ids.dims() == 1,
                InvalidArgument("segment_ids must be a vector, but has shape ",
                                segment_ids.shape().DebugString()));
    const int64_t num_ids = ids.dim_size(0);
    OP_REQUIRES(
        ctx, segment_ids.dim_size(0) == num_ids,
        InvalidArgument("segment_ids must have the same size as ids: ids has ",
                        num_ids, " elements, segment_ids has ",
                        segment_ids.dim_size(0)));
    OP_REQUIRES(
        ctx,
        weights.dims() == 1 &&
            (weights.dim_size(0) == num_ids || weights.dim_size(0) == 0),
        InvalidArgument("weights must have shape [", num_ids,
                        "] (one per id) or [0] (unweighted), but has shape ",
                        weights.shape().DebugString()));
    int64_t num_segments = 0;
    OP_REQUIRES_OK(
        ctx, ReadNumSegments(ctx->input(5), "num_segments", &num_segments));

    TensorShape out_shape;
    OP_REQUIRES_OK(ctx, OutputShape(TensorShape({num_segments}), view.dim,
                                    "num_segments", &out_shape));
    if (out_shape.num_elements() > kValidateFirstElements) {
      OP_REQUIRES_OK(ctx,
                     SegmentIdsToOffsets(segment_ids, num_segments, nullptr));
      OP_REQUIRES_OK(ctx, CheckIds(ids, view.rows, &segment_ids));
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out));

    const bool has_work = num_segments > 0 && view.dim > 0;
    // offsets[num_segments + 1]; only needed (and only allocated) when there
    // is output to compute, and then num_segments * dim floats fit in memory,
    // so num_segments + 1 cannot overflow.
    Tensor offsets_t;
    int64_t* offsets = nullptr;
    if (has_work) {
      OP_REQUIRES_OK(
          ctx, ctx->allocate_temp(tensorflow::DT_INT64,
                                  TensorShape({num_segments + 1}), &offsets_t));
      offsets = offsets_t.flat<int64_t>().data();
    }
    OP_REQUIRES_OK(ctx,
                   SegmentIdsToOffsets(segment_ids, num_segments, offsets));
    if (!has_work) {  // nothing to pool, but bad ids are still errors
      OP_REQUIRES_OK(ctx, CheckIds(ids, view.rows, &segment_ids));
      return;
    }

    PoolArgs args;
    args.table = view;
    args.ids = IdsView{ids.data(), ids.dtype() == tensorflow::DT_INT64};
    args.weights =
        weights.dim_size(0) == 0 ? nullptr : weights.flat<float>().data();
    args.bag_offsets = offsets;
    args.combiner = combiner_;
    args.prefetch_rows = PoolPrefetchRows(
        view, static_cast<double>(num_ids) / static_cast<double>(num_segments));
    args.out = out->flat<float>().data();
    args.out_stride = view.dim;
    const int64_t segment_cost =
        static_cast<int64_t>(PoolCost(num_ids, num_segments, view.dim) /
                             num_segments) +
        1;
    if (!RunKernelSharded(ctx, variant_->pool, args, &PoolArgs::bag_begin,
                          &PoolArgs::bag_end, num_segments, segment_cost,
                          max_threads_)) {
      ctx->CtxFailure(BadIdError(ids, view.rows, &segment_ids));
    }
  }

 private:
  Combiner combiner_ = Combiner::kSum;
};

REGISTER_KERNEL_BUILDER(Name("FusedDecodeAxpy").Device(tensorflow::DEVICE_CPU),
                        FusedDecodeAxpyOp);

}  // namespace
}  // namespace tfce
