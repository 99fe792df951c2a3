// BatchedFusedDecodeAxpy's per-feature inputs: one feature's table, ids, bag
// structure (bag kinds, batched_attrs.h), weights and num_bags read and
// checked, the rows counted when num_bags asks for it, padded ids packed,
// and the bags turned into the CSR offsets the kernels take.
#ifndef TFCE_KERNELS_TF_BATCHED_FEATURES_H_
#define TFCE_KERNELS_TF_BATCHED_FEATURES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/core/kernel_api.h"
#include "kernels/tf/batched_attrs.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_handle.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

namespace tfce {

// The rows a feature asks the op to count (BagCount), as num_bags values
// that cannot be given. kRowsOfBags: the rows its bag structure has (row
// splits: len - 1; dense and padded ids: their rows; sorted segment ids: the
// last id + 1). kRowsWithIds: the last row holding an id + 1 (0 without
// ids), as SparseSegment* ops without num_segments count them: the rows
// TF's embedding_lookup_sparse outputs for a SparseTensor or RaggedTensor.
constexpr int64_t kRowsOfBags = -1;
constexpr int64_t kRowsWithIds = -2;

// One feature's inputs, checked.
struct BatchedFeature {
  TableView table;
  BagKind kind = BagKind::kSegmentIds;
  const tensorflow::Tensor* ids = nullptr;         // what the kernels read:
                                                   // [num_ids] or [rows, width]
  const tensorflow::Tensor* bag_splits = nullptr;  // segment ids or row
                                                   // splits; else null
  const tensorflow::Tensor* weights = nullptr;     // [num_ids], [rows, w], [0]
  int64_t num_ids = 0;
  int64_t num_bags = 0;
  // kPadded only: its ids >= 0 (and their weights; null if unweighted)
  // packed row by row, and the offsets of ids' rows [packed_rows + 1], in
  // the call's PaddedBuffers. The kernels read these (PooledIds), not ids.
  const void* packed_ids = nullptr;
  const float* packed_weights = nullptr;
  const int64_t* packed_offsets = nullptr;
  int64_t packed_rows = 0;
  bool has_work() const { return num_bags > 0 && table.dim > 0; }
  // The ids and weights the kernels pool (null weights: unweighted).
  IdsView PooledIds() const;
  const float* PooledWeights() const;
};

// One call's room for its padded features' packed ids, weights and row
// offsets: one buffer of each for them all, handed out feature by feature,
// instead of three allocations per feature and call.
class PaddedBuffers {
 public:
  // Room for the 'padded' features of `features` (their kind, ids and
  // weights set): as many ids and weights as their inputs hold, and their
  // rows + 1 offsets. Inputs of the wrong rank get none (ReadFeatureBags
  // refuses them before it packs).
  absl::Status Allocate(tensorflow::OpKernelContext* ctx,
                        const std::vector<BatchedFeature>& features);

  // The next `count` ids of `dtype`, floats and offsets.
  void* TakeIds(int64_t count, tensorflow::DataType dtype);
  float* TakeWeights(int64_t count);
  int64_t* TakeOffsets(int64_t count);

 private:
  tensorflow::Tensor ids_, weights_, offsets_;
  // What is handed out: bytes of ids_, floats, offsets.
  int64_t ids_taken_ = 0, weights_taken_ = 0, offsets_taken_ = 0;
};

// The table variables of `handles` (null: a feature without one) looked up
// under one hold of the resource manager's lock (LookupResources), instead
// of one per table. A handle not found this way (missing, of another device
// or type, or a ref-counting eager handle, which no manager holds) is left
// null: ReadTableVariable then looks it up alone and reports it.
std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>>
LookupTableVariables(tensorflow::OpKernelContext* ctx,
                     const std::vector<const tensorflow::ResourceHandle*>&
                         handles);

// The value of the table variable of `handle` (`found`: the variable
// itself when LookupTableVariables found it, else null): its tensor,
// sharing the buffer, as read_value_no_copy() reads it (its copy-on-read
// mode turned off, so no whole-table copy and no in-place sparse update of
// the buffer read); `dtype` is what it must hold. `named` says how the op
// was given the handle: by the variable's name (table_names), or as an
// input.
absl::Status ReadTableVariable(tensorflow::OpKernelContext* ctx,
                               const tensorflow::ResourceHandle& handle,
                               tensorflow::Var* found, bool named,
                               tensorflow::DataType dtype,
                               tensorflow::Tensor* value);

// Reads the feature's bag inputs: *feature has its table, kind, ids,
// bag_splits and weights set; checks their shapes and its num_bags input
// (when `count` is kGiven; else null), sets num_ids and num_bags and, for
// padded ids, packs them into `padded` (their values are checked there; the
// other kinds' by CheckBags and CheckFeatureIds).
absl::Status ReadFeatureBags(BagCount count,
                             const tensorflow::Tensor* num_bags,
                             PaddedBuffers* padded, BatchedFeature* feature);

// Checks the feature's bag structure and, unless offsets is null, writes
// its bags' offsets[0..num_bags].
absl::Status CheckBags(const BatchedFeature& feature, int64_t* offsets);

// CheckIds (op_util.h) of the feature's ids against its table's rows;
// padded ids were checked as they were packed.
absl::Status CheckFeatureIds(const BatchedFeature& feature);

}  // namespace tfce

#endif  // TFCE_KERNELS_TF_BATCHED_FEATURES_H_
