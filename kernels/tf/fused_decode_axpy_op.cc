// FusedDecodeAxpy: validate, build per-segment offsets, run the kernel.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/core/dispatch.h"
#include "kernels/tf/huge_pages.h"
#include "kernels/core/kernel_api.h"
#include "kernels/tf/op_util.h"
#include "kernels/tf/parallel_run.h"
#include "tensorflow/core/framework/bounds_check.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tfce {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

absl::Status ParseCombiner(const std::string& name, Combiner* combiner) {
  if (name == "sum") {
    *combiner = Combiner::kSum;
  } else if (name == "mean") {
    *combiner = Combiner::kMean;
  } else if (name == "sqrtn") {
    *combiner = Combiner::kSqrtN;
  } else {
    return InvalidArgument(
        "combiner must be one of 'sum', 'mean', 'sqrtn', got '", name, "'");
  }
  return absl::OkStatus();
}

absl::Status ReadNumSegments(const Tensor& t, int64_t* num_segments) {
  if (t.dims() != 0) {
    return InvalidArgument("num_segments must be a scalar, not shape ",
                                   t.shape().DebugString());
  }
  const int64_t n = t.dtype() == tensorflow::DT_INT32
                        ? static_cast<int64_t>(t.scalar<int32_t>()())
                        : t.scalar<int64_t>()();
  if (n < 0) {
    return InvalidArgument("num_segments = ", n,
                                   " must be >= 0");
  }
  *num_segments = n;
  return absl::OkStatus();
}

// The precise error for segment ids that failed the check below: the first
// position that is out of range or out of order.
template <typename Seg>
absl::Status BadSegmentIdError(const Seg* seg, int64_t n, int64_t num_segments) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = static_cast<int64_t>(seg[i]);
    if (!tensorflow::FastBoundsCheck(s, num_segments)) {
      return InvalidArgument(
          "segment_ids[", i, "] = ", s, " is not in [0, ", num_segments,
          "): segment ids must be >= 0 and < num_segments");
    }
    if (i > 0 && s < static_cast<int64_t>(seg[i - 1])) {
      return InvalidArgument("segment_ids are not sorted: segment_ids[", i - 1,
                             "] = ", static_cast<int64_t>(seg[i - 1]),
                             " > segment_ids[", i, "] = ", s);
    }
  }
  return absl::InternalError("segment_ids changed while the op read them");
}

// The first position in [lo, n) whose segment id is >= s (n if none), for
// sorted ids: an exponential search from lo, so walking the segments in
// order costs O(log gap) per segment, O(1) for the common short bags. On
// unsorted input it still returns a position in [lo, n].
template <typename Seg>
int64_t GallopLowerBound(const Seg* seg, int64_t lo, int64_t n, int64_t s) {
  int64_t hi = lo;  // positions before lo hold ids < s
  int64_t step = 1;
  while (hi < n && static_cast<int64_t>(seg[hi]) < s) {
    lo = hi + 1;
    hi = lo + step;
    step *= 2;
  }
  if (hi > n) hi = n;
  return std::lower_bound(seg + lo, seg + hi, s,
                          [](Seg a, int64_t b) {
                            return static_cast<int64_t>(a) < b;
                          }) -
         seg;
}

// Checks that segment ids are sorted and in [0, num_segments) and, unless
// offsets is null, converts them to CSR offsets: segment s is positions
// [offsets[s], offsets[s + 1]). The check is one branch-free pass that the
// compiler vectorizes (sorted ids are in range when the first and the last
// are); the offsets are then found by checking that the next segment is as
// long as the last one, else by searching, not by another pass. Every
// offset is a position in [0, n] written to offsets[0..num_segments] whatever
// the ids hold, so a concurrent change of the input cannot push a write or a
// later read out of bounds.
template <typename Seg>
absl::Status SegmentOffsets(const Tensor& segment_ids, int64_t num_segments,
                            int64_t* offsets) {
  const Seg* seg = segment_ids.flat<Seg>().data();
  const int64_t n = segment_ids.NumElements();
  if (n > 0) {
    int unsorted = 0;  // int, not bool: GCC vectorizes only this form
    for (int64_t i = 1; i < n; ++i) unsorted |= seg[i] < seg[i - 1];
    const int64_t first = static_cast<int64_t>(seg[0]);
    const int64_t last = static_cast<int64_t>(seg[n - 1]);
    if (unsorted || !tensorflow::FastBoundsCheck(first, num_segments) ||
        !tensorflow::FastBoundsCheck(last, num_segments)) {
      return BadSegmentIdError(seg, n, num_segments);
    }
  }
  if (offsets != nullptr) {
    int64_t pos = GallopLowerBound(seg, 0, n, 0);
    int64_t len = 0;  // the last segment's length: the usual next one
    offsets[0] = pos;
    for (int64_t s = 0; s + 1 < num_segments; ++s) {
      // Segment s is [pos, next): next is the first position past pos whose
      // id is > s. Bags of one length (a padded batch) guess it right.
      const int64_t guess = pos + len;
      int64_t next;
      if (guess <= n && (guess == n || static_cast<int64_t>(seg[guess]) > s) &&
          (guess == pos || static_cast<int64_t>(seg[guess - 1]) <= s)) {
        next = guess;
      } else {
        next = GallopLowerBound(seg, pos, n, s + 1);
      }
      len = next - pos;
      offsets[s + 1] = pos = next;
    }
    offsets[num_segments] = n;
  }
  return absl::OkStatus();
}

absl::Status ValidateSegmentIds(const Tensor& segment_ids,
                                int64_t num_segments) {
  return segment_ids.dtype() == tensorflow::DT_INT32
             ? SegmentOffsets<int32_t>(segment_ids, num_segments, nullptr)
             : SegmentOffsets<int64_t>(segment_ids, num_segments, nullptr);
}

class FusedDecodeAxpyOp : public OpKernel {
 public:
  explicit FusedDecodeAxpyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string combiner;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiner", &combiner));
    OP_REQUIRES_OK(ctx, ParseCombiner(combiner, &combiner_));
    OP_REQUIRES_OK(ctx, GetKernels(&kernels_));
    OP_REQUIRES_OK(ctx, ReadMaxThreads(ctx, &max_threads_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& table = ctx->input(0);
    const Tensor& scales = ctx->input(1);
    const Tensor& ids = ctx->input(2);
    const Tensor& segment_ids = ctx->input(3);
    const Tensor& weights = ctx->input(4);

    TableView view;
    OP_REQUIRES_OK(ctx, MakeTableView(table, scales, &view));
    AdviseHugePages(view);
    OP_REQUIRES(ctx, ids.dims() == 1,
                InvalidArgument("ids must be a vector, but has shape ",
                                        ids.shape().DebugString()));
    OP_REQUIRES(ctx, segment_ids.dims() == 1,
                InvalidArgument(
                    "segment_ids must be a vector, but has shape ",
                    segment_ids.shape().DebugString()));
    const int64_t num_ids = ids.dim_size(0);
    OP_REQUIRES(ctx, segment_ids.dim_size(0) == num_ids,
                InvalidArgument(
                    "segment_ids must have the same size as ids: ids has ",
                    num_ids, " elements, segment_ids has ",
                    segment_ids.dim_size(0)));
    OP_REQUIRES(ctx,
                weights.dims() == 1 && (weights.dim_size(0) == num_ids ||
                                        weights.dim_size(0) == 0),
                InvalidArgument(
                    "weights must have shape [", num_ids,
                    "] (one per id) or [0] (unweighted), but has shape ",
                    weights.shape().DebugString()));
    int64_t num_segments = 0;
    OP_REQUIRES_OK(ctx, ReadNumSegments(ctx->input(5), &num_segments));

    TensorShape out_shape;
    OP_REQUIRES_OK(ctx, OutputShape(TensorShape({num_segments}), view.dim,
                                    "num_segments", &out_shape));
    if (out_shape.num_elements() > kValidateFirstElements) {
      OP_REQUIRES_OK(ctx, ValidateSegmentIds(segment_ids, num_segments));
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
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT64,
                                             TensorShape({num_segments + 1}),
                                             &offsets_t));
      offsets = offsets_t.flat<int64_t>().data();
    }
    OP_REQUIRES_OK(ctx, segment_ids.dtype() == tensorflow::DT_INT32
                            ? SegmentOffsets<int32_t>(segment_ids,
                                                      num_segments, offsets)
                            : SegmentOffsets<int64_t>(segment_ids,
                                                      num_segments, offsets));
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
    std::atomic<bool> ok(true);
    const PoolFn pool = kernels_->pool;
    // Cost of one segment: its average number of ids times the row work.
    const int64_t ids_per_segment = num_ids / num_segments + 1;
    ParallelRun(ctx, num_segments, ids_per_segment * (view.dim * 2 + 20),
                max_threads_, [&args, &ok, pool](int64_t begin, int64_t end) {
                  PoolArgs shard = args;
                  shard.bag_begin = begin;
                  shard.bag_end = end;
                  if (!pool(shard)) ok.store(false);
                });
    if (!ok.load()) ctx->CtxFailure(BadIdError(ids, view.rows, &segment_ids));
  }

 private:
  Combiner combiner_ = Combiner::kSum;
  const KernelSet* kernels_ = nullptr;
  int64_t max_threads_ = 0;  // 0: all intra-op threads
};

REGISTER_KERNEL_BUILDER(Name("FusedDecodeAxpy").Device(tensorflow::DEVICE_CPU),
                        FusedDecodeAxpyOp);

}  // namespace
}  // namespace tfce
