// BatchedFusedDecodeAxpy: validate every feature (errors name it), build the
// bags' offsets, cut the features' bags into tiles (core/batched_pool.h) and
// run them over the intra-op pool, then report a bad id of the first feature
// that has one.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/core/batched_pool.h"
#include "kernels/core/dispatch.h"
#include "kernels/core/kernel_api.h"
#include "kernels/core/prefetch_policy.h"
#include "kernels/tf/bag_inputs.h"
#include "kernels/tf/batched_attrs.h"
#include "kernels/tf/huge_pages.h"
#include "kernels/tf/op_util.h"
#include "kernels/tf/parallel_run.h"
#include "kernels/tf/table_format.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tfce {
namespace {

using ::tensorflow::OpInputList;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::OpOutputList;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// num_bags values that ask the op to count a feature's rows itself.
// kRowsOfBags: the rows its bag structure has (row splits: len - 1; dense
// and padded ids: their rows; sorted segment ids: the last id + 1).
// kRowsWithIds: the last row holding an id + 1 (0 without ids), as
// SparseSegment* ops without num_segments count them: the rows TF's
// embedding_lookup_sparse outputs for a SparseTensor or RaggedTensor.
constexpr int64_t kRowsOfBags = -1;
constexpr int64_t kRowsWithIds = -2;

// One feature's inputs, checked.
struct Feature {
  TableView table;
  BagKind kind;
  const Tensor* ids;         // what the kernels read: [num_ids] or [rows, w]
  const Tensor* bag_splits;  // segment ids or row splits; unused otherwise
  const Tensor* weights;     // [num_ids], [rows, w], or [0]
  int64_t num_ids;
  int64_t num_bags;
  // kPadded: the ids >= 0 (and their weights) packed row by row, and their
  // rows' offsets; `ids` and `weights` point at the packed copies.
  Tensor packed_ids, packed_weights, padded_offsets;
  bool has_work() const { return num_bags > 0 && table.dim > 0; }
};

class BatchedFusedDecodeAxpyOp : public tensorflow::OpKernel {
 public:
  explicit BatchedFusedDecodeAxpyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, GetKernelVariant(&variant_));
    OP_REQUIRES_OK(ctx, ReadMaxThreads(ctx, &max_threads_));
    OP_REQUIRES_OK(ctx, ReadBatchedAttrs(ctx, &attrs_));
    num_features_ = attrs_.num_features;
    concat_ = attrs_.concat;
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList tables, scales, ids, bag_splits, weights, num_bags;
    OP_REQUIRES_OK(ctx, ctx->input_list("tables", &tables));
    OP_REQUIRES_OK(ctx, ctx->input_list("scales", &scales));
    OP_REQUIRES_OK(ctx, ctx->input_list("ids", &ids));
    OP_REQUIRES_OK(ctx, ctx->input_list("bag_splits", &bag_splits));
    OP_REQUIRES_OK(ctx, ctx->input_list("weights", &weights));
    OP_REQUIRES_OK(ctx, ctx->input_list("num_bags", &num_bags));
    std::vector<Feature> features(num_features_);
    for (int64_t f = 0; f < num_features_; ++f) {
      Feature& feature = features[f];
      OP_REQUIRES_OK(
          ctx,
          Labeled(f, MakeTableView(tables[f], scales[f], attrs_.storages[f],
                                   attrs_.dims[f], &feature.table)));
      feature.kind = attrs_.bag_kinds[f];
      feature.ids = &ids[f];
      feature.bag_splits = &bag_splits[f];
      feature.weights = &weights[f];
      OP_REQUIRES_OK(ctx, Labeled(f, ReadBagInputs(num_bags[f], &feature)));
      if (feature.kind == BagKind::kPadded) {
        OP_REQUIRES_OK(ctx, Labeled(f, PackPadded(ctx, &feature)));
      }
    }

    // Outputs: one per feature, or the features' columns side by side.
    std::vector<TensorShape> shapes;
    std::vector<int64_t> columns(num_features_, 0);  // first output column
    int64_t out_elements = 0;
    if (concat_) {
      int64_t width = 0;
      for (int64_t f = 0; f < num_features_; ++f) {
        OP_REQUIRES(
            ctx, features[f].num_bags == features[0].num_bags,
            Labeled(f, InvalidArgument(
                           "has ", features[f].num_bags, " bags, but ",
                           Label(0), " has ", features[0].num_bags,
                           ": a concatenated output (concat = true) needs "
                           "the same number of bags, its rows, in every "
                           "feature")));
        columns[f] = width;
        width += features[f].table.dim;
        OP_REQUIRES(
            ctx, width <= kMaxDim,
            InvalidArgument("the features' dims add up to more than ", kMaxDim,
                            ", the widest concatenated output"));
      }
      shapes.resize(1);
      OP_REQUIRES_OK(ctx, OutputShape(TensorShape({features[0].num_bags}),
                                      width, "num_bags", &shapes[0]));
      out_elements = shapes[0].num_elements();
    } else {
      shapes.resize(num_features_);
      for (int64_t f = 0; f < num_features_; ++f) {
        OP_REQUIRES_OK(
            ctx, Labeled(f, OutputShape(TensorShape({features[f].num_bags}),
                                        features[f].table.dim, "num_bags",
                                        &shapes[f])));
        out_elements += shapes[f].num_elements();
        if (out_elements < 0) {
          // A bad input of any feature is the better report: check them
          // all before naming the feature whose output did not fit.
          out_elements = std::numeric_limits<int64_t>::max();
          for (int64_t g = 0; g < num_features_; ++g) {
            OP_REQUIRES_OK(ctx, Labeled(g, CheckBags(features[g], nullptr)));
            OP_REQUIRES_OK(ctx, Labeled(g, CheckFeatureIds(features[g])));
          }
          ctx->CtxFailure(Labeled(
              f, InvalidArgument("the outputs have more elements than int64 "
                                 "can count: num_bags = ",
                                 features[f].num_bags,
                                 " or the tables' dims are too large")));
          return;
        }
      }
    }
    if (out_elements > kValidateFirstElements) {
      for (int64_t f = 0; f < num_features_; ++f) {
        OP_REQUIRES_OK(ctx, Labeled(f, CheckBags(features[f], nullptr)));
        OP_REQUIRES_OK(ctx, Labeled(f, CheckFeatureIds(features[f])));
      }
    }
    OpOutputList outputs;
    OP_REQUIRES_OK(ctx, ctx->output_list("outputs", &outputs));
    std::vector<float*> out(num_features_, nullptr);
    for (size_t o = 0; o < shapes.size(); ++o) {
      Tensor* t = nullptr;
      OP_REQUIRES_OK(ctx, outputs.allocate(o, shapes[o], &t));
      float* base = t->flat<float>().data();
      if (concat_) {
        for (int64_t f = 0; f < num_features_; ++f) out[f] = base + columns[f];
      } else {
        out[o] = base;
      }
    }

    // Offsets of every feature with work, in one buffer: each such feature
    // has an output of num_bags * dim >= num_bags floats, so the sum of
    // (num_bags + 1) cannot overflow.
    int64_t total_offsets = 0;
    for (const Feature& feature : features) {
      if (feature.has_work()) total_offsets += feature.num_bags + 1;
    }
    Tensor offsets_t;
    OP_REQUIRES_OK(
        ctx, ctx->allocate_temp(tensorflow::DT_INT64,
                                TensorShape({total_offsets}), &offsets_t));
    int64_t* offsets = offsets_t.flat<int64_t>().data();
    std::vector<PoolArgs> args(num_features_);
    double total_cost = 0;
    for (int64_t f = 0; f < num_features_; ++f) {
      const Feature& feature = features[f];
      if (!feature.has_work()) {  // nothing to pool; bad input still errs
        OP_REQUIRES_OK(ctx, Labeled(f, CheckBags(feature, nullptr)));
        OP_REQUIRES_OK(ctx, Labeled(f, CheckFeatureIds(feature)));
        continue;  // args[f] has no bags: no tile
      }
      OP_REQUIRES_OK(ctx, Labeled(f, CheckBags(feature, offsets)));
      PoolArgs& a = args[f];
      a.table = feature.table;
      AdviseHugePages(feature.table);
      a.ids = IdsView{feature.ids->data(),
                      feature.ids->dtype() == tensorflow::DT_INT64};
      a.weights = feature.weights->NumElements() == 0
                      ? nullptr
                      : feature.weights->flat<float>().data();
      a.bag_offsets = offsets;
      a.combiner = attrs_.combiners[f];
      a.bag_begin = 0;
      a.bag_end = feature.num_bags;
      a.out = out[f];
      a.out_stride = concat_ ? shapes[0].dim_size(1) : feature.table.dim;
      a.prefetch_rows = PoolPrefetchRows(
          feature.table, static_cast<double>(feature.num_ids) /
                             static_cast<double>(feature.num_bags));
      offsets += feature.num_bags + 1;
      total_cost +=
          PoolCost(feature.num_ids, feature.num_bags, feature.table.dim);
    }

    const int64_t threads = ParallelRunThreads(ctx, max_threads_);
    const bool split = threads > 1 && total_cost >= MinParallelCost();
    const std::vector<PoolTile> tiles = PlanPoolTiles(
        args.data(), num_features_,
        split ? std::max(kMinChunkCost,
                         total_cost /
                             static_cast<double>(threads * kChunksPerThread))
              : 0.0);
    if (tiles.empty()) return;
    std::atomic<bool> ok(true);
    const int64_t tile_cost =
        static_cast<int64_t>(total_cost / static_cast<double>(tiles.size())) +
        1;
    ParallelRun(ctx, static_cast<int64_t>(tiles.size()), tile_cost,
                max_threads_, [&](int64_t begin, int64_t end) {
                  int64_t bad_feature = -1;
                  if (!RunPoolTiles(variant_->pool, args.data(), tiles.data(),
                                    begin, end, &bad_feature)) {
                    ok.store(false);
                  }
                });
    if (!ok.load()) {
      // The first feature in order with a bad id, whichever thread saw one.
      for (int64_t f = 0; f < num_features_; ++f) {
        OP_REQUIRES_OK(ctx, Labeled(f, CheckFeatureIds(features[f])));
      }
      ctx->CtxFailure(
          absl::InternalError("ids changed while the op was reading them"));
    }
  }

 private:
  std::string Label(int64_t f) const { return attrs_.Label(f); }
  absl::Status Labeled(int64_t f, const absl::Status& status) const {
    return attrs_.Labeled(f, status);
  }

  // Checks a feature's ids, bag structure, weights and num_bags shapes, and
  // sets num_ids and num_bags (the values are checked by CheckBags; a
  // padded feature's by PackPadded).
  static absl::Status ReadBagInputs(const Tensor& num_bags, Feature* feature) {
    if (num_bags.dims() != 0) {
      return InvalidArgument("num_bags must be a scalar, not shape ",
                             num_bags.shape().DebugString());
    }
    if (feature->kind == BagKind::kDense ||
        feature->kind == BagKind::kPadded) {
      return ReadMatrixBagInputs(num_bags, feature);
    }
    const Tensor& ids = *feature->ids;
    const Tensor& splits = *feature->bag_splits;
    const bool row_splits = feature->kind == BagKind::kRowSplits;
    const char* splits_name = row_splits ? "row_splits" : "segment_ids";
    if (ids.dims() != 1) {
      return InvalidArgument("ids must be a vector, but has shape ",
                             ids.shape().DebugString());
    }
    feature->num_ids = ids.dim_size(0);
    if (splits.dims() != 1) {
      return InvalidArgument(splits_name, " must be a vector, but has shape ",
                             splits.shape().DebugString());
    }
    const Tensor& weights = *feature->weights;
    if (weights.dims() != 1 ||
        (weights.dim_size(0) != feature->num_ids && weights.dim_size(0) != 0)) {
      return InvalidArgument("weights must have shape [", feature->num_ids,
                             "] (one per id) or [0] (unweighted), but has "
                             "shape ",
                             weights.shape().DebugString());
    }
    const int64_t given = ScalarInt(num_bags);
    if (row_splits) {
      if (splits.dim_size(0) < 1) {
        return InvalidArgument(
            "row_splits must have at least one element (rows + 1), but has "
            "shape ",
            splits.shape().DebugString());
      }
      feature->num_bags = splits.dim_size(0) - 1;
      if (given == kRowsWithIds) {
        // Drops the trailing empty rows of the splits as read here;
        // CheckBags checks the copy it uses agrees.
        const int64_t rows = feature->num_bags;
        feature->num_bags = 0;
        for (int64_t b = rows; b >= 1; --b) {
          if (SplitAt(splits, b) != SplitAt(splits, b - 1)) {
            feature->num_bags = b;
            break;
          }
        }
      } else if (given != kRowsOfBags && given != feature->num_bags) {
        return InvalidArgument(
            "num_bags = ", given, " but row_splits has ", splits.dim_size(0),
            " elements, so ", feature->num_bags,
            " rows: pass -1 (the rows the splits give), -2 (the last row "
            "holding an id + 1) or their number");
      }
      return absl::OkStatus();
    }
    if (splits.dim_size(0) != feature->num_ids) {
      return InvalidArgument(
          "segment_ids must have the same size as ids: ids has ",
          feature->num_ids, " elements, segment_ids has ", splits.dim_size(0));
    }
    if (given == kRowsOfBags || given == kRowsWithIds) {
      // A last id that is negative or that cannot be counted past gives 0
      // rows, and CheckBags then names it.
      const int64_t last =
          feature->num_ids == 0
              ? -1
              : (splits.dtype() == tensorflow::DT_INT32
                     ? int64_t{splits.flat<int32_t>()(feature->num_ids - 1)}
                     : splits.flat<int64_t>()(feature->num_ids - 1));
      feature->num_bags =
          last < 0 || last == std::numeric_limits<int64_t>::max() ? 0
                                                                  : last + 1;
      return absl::OkStatus();
    }
    return ReadNumSegments(num_bags, "num_bags", &feature->num_bags);
  }

  // ReadBagInputs of a 'dense' or 'padded' feature: ids [rows, width], no
  // bag_splits. A padded feature's num_bags stays kRowsWithIds until
  // PackPadded has counted its rows.
  static absl::Status ReadMatrixBagInputs(const Tensor& num_bags,
                                          Feature* feature) {
    const Tensor& ids = *feature->ids;
    const bool dense = feature->kind == BagKind::kDense;
    const char* kind = dense ? "'dense'" : "'padded'";
    if (ids.dims() != 2) {
      return InvalidArgument("ids must be a matrix [rows, width] (bag kind ",
                             kind, "), but has shape ",
                             ids.shape().DebugString());
    }
    const Tensor& splits = *feature->bag_splits;
    if (splits.dims() != 1 || splits.dim_size(0) != 0) {
      return InvalidArgument(
          "bag_splits must be empty, shape [0], for bag kind ", kind,
          " (each row of ids is a bag), but has shape ",
          splits.shape().DebugString());
    }
    const Tensor& weights = *feature->weights;
    if (weights.shape() != ids.shape() &&
        !(weights.dims() == 1 && weights.dim_size(0) == 0)) {
      return InvalidArgument("weights must have the shape of ids, ",
                             ids.shape().DebugString(),
                             ", or [0] (unweighted), but has shape ",
                             weights.shape().DebugString());
    }
    const int64_t rows = ids.dim_size(0);
    const int64_t given = ScalarInt(num_bags);
    if (dense) {
      feature->num_ids = ids.NumElements();
      feature->num_bags = given == kRowsWithIds && ids.dim_size(1) == 0 ? 0 : rows;
      if (given != kRowsOfBags && given != kRowsWithIds && given != rows) {
        return InvalidArgument("num_bags = ", given, " but ids has ", rows,
                               " rows: pass -1, -2 or ", rows);
      }
      return absl::OkStatus();
    }
    if (given == kRowsOfBags) {
      feature->num_bags = rows;
      return absl::OkStatus();
    }
    if (given == kRowsWithIds) {
      feature->num_bags = kRowsWithIds;
      return absl::OkStatus();
    }
    return ReadNumSegments(num_bags, "num_bags", &feature->num_bags);
  }

  // Packs a padded feature's ids >= 0 (core of PackPaddedIds) and settles
  // its num_bags: the last row with an id + 1 for -1, else at least that.
  static absl::Status PackPadded(OpKernelContext* ctx, Feature* feature) {
    const Tensor& ids = *feature->ids;
    const Tensor& weights = *feature->weights;
    const int64_t rows = ids.dim_size(0);
    const TensorShape capacity({ids.NumElements()});
    TF_RETURN_IF_ERROR(
        ctx->allocate_temp(ids.dtype(), capacity, &feature->packed_ids));
    const bool weighted = weights.dims() == 2;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(
        tensorflow::DT_FLOAT, weighted ? capacity : TensorShape({0}),
        &feature->packed_weights));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(
        tensorflow::DT_INT64, TensorShape({rows + 1}),
        &feature->padded_offsets));
    int64_t* offsets = feature->padded_offsets.flat<int64_t>().data();
    int64_t rows_with_ids = 0;
    TF_RETURN_IF_ERROR(PackPaddedIds(ids, weights, feature->table.rows,
                                     &feature->packed_ids,
                                     &feature->packed_weights, offsets,
                                     &rows_with_ids));
    feature->num_ids = offsets[rows];
    feature->packed_ids = feature->packed_ids.Slice(0, feature->num_ids);
    if (weighted) {
      feature->packed_weights =
          feature->packed_weights.Slice(0, feature->num_ids);
    }
    feature->ids = &feature->packed_ids;
    feature->weights = &feature->packed_weights;
    if (feature->num_bags == kRowsWithIds) {
      feature->num_bags = rows_with_ids;
    } else if (feature->num_bags < rows_with_ids) {
      return InvalidArgument("num_bags = ", feature->num_bags, " but row ",
                             rows_with_ids - 1,
                             " of ids holds ids: pass -1 (ids' rows), -2 "
                             "(the last row holding an id + 1) or at least ",
                             rows_with_ids);
    }
    return absl::OkStatus();
  }

  static int64_t SplitAt(const Tensor& splits, int64_t i) {
    return splits.dtype() == tensorflow::DT_INT32
               ? int64_t{splits.flat<int32_t>()(i)}
               : splits.flat<int64_t>()(i);
  }

  static int64_t ScalarInt(const Tensor& t) {
    return t.dtype() == tensorflow::DT_INT32 ? int64_t{t.scalar<int32_t>()()}
                                             : t.scalar<int64_t>()();
  }

  // Checks the feature's bag structure and, unless offsets is null, writes
  // its bags' offsets[0..num_bags].
  static absl::Status CheckBags(const Feature& feature, int64_t* offsets) {
    switch (feature.kind) {
      case BagKind::kSegmentIds:
        return SegmentIdsToOffsets(*feature.bag_splits, feature.num_bags,
                                   offsets);
      case BagKind::kRowSplits:
        return CheckRowSplits(feature, offsets);
      case BagKind::kDense:
        if (offsets != nullptr) {
          const int64_t width = feature.ids->dim_size(1);
          for (int64_t b = 0; b <= feature.num_bags; ++b) {
            offsets[b] = b * width;
          }
        }
        return absl::OkStatus();
      case BagKind::kPadded:
        if (offsets != nullptr) {  // rows past ids' are empty bags
          const int64_t rows = feature.padded_offsets.dim_size(0) - 1;
          const int64_t* packed = feature.padded_offsets.flat<int64_t>().data();
          for (int64_t b = 0; b <= feature.num_bags; ++b) {
            offsets[b] = packed[std::min(b, rows)];
          }
        }
        return absl::OkStatus();
    }
    return absl::InternalError("unknown bag kind");
  }

  // CheckBags of row splits: all of them are checked, the first
  // num_bags + 1 written (fewer when -2 dropped trailing empty rows).
  static absl::Status CheckRowSplits(const Feature& feature,
                                     int64_t* offsets) {
    const Tensor& splits = *feature.bag_splits;
    if (feature.num_bags == splits.dim_size(0) - 1) {
      return RowSplitsToOffsets(splits, feature.num_ids, offsets);
    }
    std::vector<int64_t> all(splits.dim_size(0));
    TF_RETURN_IF_ERROR(RowSplitsToOffsets(splits, feature.num_ids, all.data()));
    if (all[feature.num_bags] != feature.num_ids) {
      return absl::InternalError("row_splits changed while the op read them");
    }
    if (offsets != nullptr) {
      std::copy(all.begin(), all.begin() + feature.num_bags + 1, offsets);
    }
    return absl::OkStatus();
  }

  static absl::Status CheckFeatureIds(const Feature& feature) {
    return CheckIds(*feature.ids, feature.table.rows,
                    feature.kind == BagKind::kSegmentIds ? feature.bag_splits
                                                         : nullptr);
  }

  const KernelVariant* variant_ = nullptr;
  int64_t max_threads_ = 0;
  BatchedAttrs attrs_;
  int64_t num_features_ = 0;
  bool concat_ = false;
};
REGISTER_KERNEL_BUILDER(
    Name("BatchedFusedDecodeAxpy").Device(tensorflow::DEVICE_CPU),
    BatchedFusedDecodeAxpyOp);

}  // namespace
}  // namespace tfce
