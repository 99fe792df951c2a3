// BatchedFusedDecodeAxpy: read every feature (batched_features.h; errors
// name it), lay out the outputs, build the bags' offsets, cut the features'
// bags into tiles (core/batched_pool.h) and run them over the intra-op pool,
// then report a bad id of the first feature that has one.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "kernels/core/batched_pool.h"
#include "kernels/core/dispatch.h"
#include "kernels/core/kernel_api.h"
#include "kernels/core/prefetch_policy.h"
#include "kernels/tf/bag_inputs.h"
#include "kernels/tf/batched_attrs.h"
#include "kernels/tf/batched_features.h"
#include "kernels/tf/huge_pages.h"
#include "kernels/tf/op_util.h"
#include "kernels/tf/parallel_run.h"
#include "kernels/tf/table_format.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
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
    // A feature's input in `list`, or `absent` when it has none there.
    auto input = [&](const OpInputList& list, BatchedInput which, int64_t f,
                     const Tensor* absent) {
      const int64_t position = attrs_.Position(which, f);
      return position < 0 ? absent : &list[static_cast<int>(position)];
    };
    if (!attrs_.table_names.empty()) {
      // The named tables' handles, made on the first call as a graph's
      // VarHandleOp makes its handle (empty container: the resource
      // manager's default). Not in the constructor: Grappler's constant
      // folding constructs kernels on a bare DeviceBase, which has no name
      // for a handle.
      absl::call_once(named_tables_once_, [&] {
        for (const std::string& name : attrs_.table_names) {
          named_tables_.push_back(
              tensorflow::MakeResourceHandle<tensorflow::Var>(
                  ctx, /*container=*/"", name));
        }
      });
    }
    const bool named = !named_tables_.empty();
    std::vector<const tensorflow::ResourceHandle*> handles(num_features_,
                                                          nullptr);
    for (int64_t f = 0; f < num_features_; ++f) {
      if (!attrs_.table_is_handle[f]) continue;
      handles[f] = named ? &named_tables_[f]
                         : &tensorflow::HandleFromInput(
                               ctx, static_cast<int>(attrs_.InputIndex(
                                        BatchedInput::kTables, f)));
    }
    const std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>> found =
        LookupTableVariables(ctx, handles);
    std::vector<BatchedFeature> features(num_features_);
    for (int64_t f = 0; f < num_features_; ++f) {
      features[f].kind = attrs_.bag_kinds[f];
      features[f].ids = &ids[f];
      features[f].bag_splits =
          input(bag_splits, BatchedInput::kBagSplits, f, nullptr);
      features[f].weights =
          input(weights, BatchedInput::kWeights, f, &no_floats_);
    }
    PaddedBuffers padded;
    OP_REQUIRES_OK(ctx, padded.Allocate(ctx, features));
    // The values of tables given as variable handles, held for the call.
    std::vector<Tensor> variables(num_features_);
    for (int64_t f = 0; f < num_features_; ++f) {
      BatchedFeature& feature = features[f];
      if (f + 1 < num_features_ && features[f + 1].kind == BagKind::kPadded) {
        PrefetchPaddedIds(*features[f + 1].ids);
      }
      const Tensor* table = &variables[f];
      if (handles[f] != nullptr) {
        OP_REQUIRES_OK(ctx, Labeled(f, ReadTableVariable(
                                           ctx, *handles[f], found[f].get(),
                                           named, attrs_.table_dtypes[f],
                                           &variables[f])));
      } else {
        table = &tables[static_cast<int>(f)];
      }
      const Tensor* table_scales =
          input(scales, BatchedInput::kScales, f, &no_floats_);
      OP_REQUIRES_OK(ctx, Labeled(f, MakeTableView(*table, *table_scales,
                                                   attrs_.storages[f],
                                                   attrs_.dims[f],
                                                   &feature.table)));
      OP_REQUIRES_OK(
          ctx, Labeled(f, ReadFeatureBags(
                              attrs_.bag_counts[f],
                              input(num_bags, BatchedInput::kNumBags, f,
                                    nullptr),
                              &padded, &feature)));
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
    for (const BatchedFeature& feature : features) {
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
      const BatchedFeature& feature = features[f];
      if (!feature.has_work()) {  // nothing to pool; bad input still errs
        OP_REQUIRES_OK(ctx, Labeled(f, CheckBags(feature, nullptr)));
        OP_REQUIRES_OK(ctx, Labeled(f, CheckFeatureIds(feature)));
        continue;  // args[f] has no bags: no tile
      }
      OP_REQUIRES_OK(ctx, Labeled(f, CheckBags(feature, offsets)));
      PoolArgs& a = args[f];
      a.table = feature.table;
      AdviseHugePages(feature.table);
      a.ids = feature.PooledIds();
      a.weights = feature.PooledWeights();
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

  const KernelVariant* variant_ = nullptr;
  int64_t max_threads_ = 0;
  BatchedAttrs attrs_;
  // The scales of a table without them, the weights of an unweighted
  // feature: [0].
  const Tensor no_floats_{tensorflow::DT_FLOAT, TensorShape({0})};
  absl::once_flag named_tables_once_;
  std::vector<tensorflow::ResourceHandle> named_tables_;  // by table_names
  int64_t num_features_ = 0;
  bool concat_ = false;
};
REGISTER_KERNEL_BUILDER(
    Name("BatchedFusedDecodeAxpy").Device(tensorflow::DEVICE_CPU),
    BatchedFusedDecodeAxpyOp);

}  // namespace
}  // namespace tfce
