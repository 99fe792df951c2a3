#include "kernels/tf/batched_features.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/tf/bag_inputs.h"
#include "kernels/tf/op_util.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tfce {

using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

namespace {

// `requested`, here and below: a given num_bags (>= 0), kRowsOfBags or
// kRowsWithIds.
// ReadFeatureBags of a 'segment_ids' or 'row_splits' feature: ids
// [num_ids], bag_splits a vector.
absl::Status ReadVectorBags(int64_t requested, BatchedFeature* feature) {
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
  if (row_splits) {
    if (splits.dim_size(0) < 1) {
      return InvalidArgument(
          "row_splits must have at least one element (rows + 1), but has "
          "shape ",
          splits.shape().DebugString());
    }
    feature->num_bags = splits.dim_size(0) - 1;
    if (requested == kRowsWithIds) {
      // Drops the trailing empty rows of the splits as read here;
      // CheckBags checks the copy it uses agrees.
      const int64_t rows = feature->num_bags;
      feature->num_bags = 0;
      for (int64_t b = rows; b >= 1; --b) {
        if (IntAt(splits, b) != IntAt(splits, b - 1)) {
          feature->num_bags = b;
          break;
        }
      }
    } else if (requested != kRowsOfBags && requested != feature->num_bags) {
      return InvalidArgument(
          "num_bags = ", requested, " but row_splits has ",
          splits.dim_size(0), " elements, so ", feature->num_bags,
          " rows: give their number, or let the op count them (bag_counts "
          "'rows_of_bags': the rows the splits give; 'rows_with_ids': the "
          "last row holding an id + 1)");
    }
    return absl::OkStatus();
  }
  if (splits.dim_size(0) != feature->num_ids) {
    return InvalidArgument(
        "segment_ids must have the same size as ids: ids has ",
        feature->num_ids, " elements, segment_ids has ", splits.dim_size(0));
  }
  if (requested == kRowsOfBags || requested == kRowsWithIds) {
    // A last id that is negative or that cannot be counted past gives 0
    // rows, and CheckBags then names it.
    const int64_t last =
        feature->num_ids == 0 ? -1 : IntAt(splits, feature->num_ids - 1);
    feature->num_bags =
        last < 0 || last == std::numeric_limits<int64_t>::max() ? 0 : last + 1;
    return absl::OkStatus();
  }
  feature->num_bags = requested;
  return absl::OkStatus();
}

// ReadFeatureBags of a 'dense' or 'padded' feature: a 'padded' one's
// num_bags is kRowsWithIds until PackPadded has counted its rows.
absl::Status ReadMatrixBags(int64_t requested, BatchedFeature* feature) {
  const Tensor& ids = *feature->ids;
  const bool dense = feature->kind == BagKind::kDense;
  const char* kind = dense ? "'dense'" : "'padded'";
  if (ids.dims() != 2) {
    return InvalidArgument("ids must be a matrix [rows, width] (bag kind ",
                           kind, "), but has shape ",
                           ids.shape().DebugString());
  }
  const Tensor& weights = *feature->weights;
  if (weights.shape() != ids.shape() &&
      !(weights.dims() == 1 && weights.dim_size(0) == 0)) {
    return InvalidArgument(
        "weights must have the shape of ids, ", ids.shape().DebugString(),
        ", or [0] (unweighted), but has shape ", weights.shape().DebugString());
  }
  const int64_t rows = ids.dim_size(0);
  if (dense) {
    feature->num_ids = ids.NumElements();
    feature->num_bags =
        requested == kRowsWithIds && ids.dim_size(1) == 0 ? 0 : rows;
    if (requested >= 0 && requested != rows) {
      return InvalidArgument("num_bags = ", requested, " but ids has ", rows,
                             " rows: give ", rows,
                             ", or let the op count them (bag_counts "
                             "'rows_of_bags' or 'rows_with_ids')");
    }
    return absl::OkStatus();
  }
  feature->num_bags = requested == kRowsOfBags ? rows : requested;
  return absl::OkStatus();
}

// Packs a padded feature's ids >= 0 (and their weights) row by row into
// `padded`, and settles its num_bags: the last row with an id + 1 for
// kRowsWithIds, else at least that.
absl::Status PackPadded(PaddedBuffers* padded, BatchedFeature* feature) {
  const Tensor& ids = *feature->ids;
  const Tensor& weights = *feature->weights;
  const int64_t rows = ids.dim_size(0);
  const int64_t capacity = ids.NumElements();
  const bool weighted = weights.dims() == 2;
  void* packed_ids = padded->TakeIds(capacity, ids.dtype());
  float* packed_weights = weighted ? padded->TakeWeights(capacity) : nullptr;
  int64_t* offsets = padded->TakeOffsets(rows + 1);
  int64_t rows_with_ids = 0;
  TF_RETURN_IF_ERROR(PackPaddedIds(ids, weights, feature->table.rows,
                                   packed_ids, packed_weights, offsets,
                                   &rows_with_ids));
  feature->num_ids = offsets[rows];
  feature->packed_ids = packed_ids;
  feature->packed_weights = packed_weights;
  feature->packed_offsets = offsets;
  feature->packed_rows = rows;
  if (feature->num_bags == kRowsWithIds) {
    feature->num_bags = rows_with_ids;
  } else if (feature->num_bags < rows_with_ids) {
    return InvalidArgument("num_bags = ", feature->num_bags, " but row ",
                           rows_with_ids - 1,
                           " of ids holds ids: give at least ", rows_with_ids,
                           ", or let the op count them (bag_counts "
                           "'rows_of_bags': ids' rows; 'rows_with_ids': the "
                           "last row holding an id + 1)");
  }
  return absl::OkStatus();
}

// Bytes of `count` ids of `dtype`, rounded up so the next feature's ids
// stay 8-byte aligned.
int64_t IdsBytes(int64_t count, tensorflow::DataType dtype) {
  return (count * tensorflow::DataTypeSize(dtype) + 7) / 8 * 8;
}

// CheckBags of row splits: checks them all and writes num_bags + 1 offsets
// (fewer than the splits when kRowsWithIds dropped trailing empty rows).
absl::Status CheckRowSplits(const BatchedFeature& feature, int64_t* offsets) {
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

}  // namespace

IdsView BatchedFeature::PooledIds() const {
  const bool is_int64 = ids->dtype() == tensorflow::DT_INT64;
  return IdsView{kind == BagKind::kPadded ? packed_ids : ids->data(),
                 is_int64};
}

const float* BatchedFeature::PooledWeights() const {
  if (kind == BagKind::kPadded) return packed_weights;
  return weights->NumElements() == 0 ? nullptr : weights->flat<float>().data();
}

absl::Status PaddedBuffers::Allocate(
    tensorflow::OpKernelContext* ctx,
    const std::vector<BatchedFeature>& features) {
  int64_t id_bytes = 0, weights = 0, offsets = 0;
  for (const BatchedFeature& feature : features) {
    if (feature.kind != BagKind::kPadded || feature.ids->dims() != 2) continue;
    const int64_t count = feature.ids->NumElements();
    id_bytes += IdsBytes(count, feature.ids->dtype());
    if (feature.weights->dims() == 2) weights += count;
    offsets += feature.ids->dim_size(0) + 1;
  }
  if (id_bytes > 0) {
    TF_RETURN_IF_ERROR(ctx->allocate_temp(
        tensorflow::DT_INT64, TensorShape({id_bytes / 8}), &ids_));
  }
  if (weights > 0) {
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_FLOAT,
                                          TensorShape({weights}), &weights_));
  }
  if (offsets > 0) {
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT64,
                                          TensorShape({offsets}), &offsets_));
  }
  return absl::OkStatus();
}

void* PaddedBuffers::TakeIds(int64_t count, tensorflow::DataType dtype) {
  char* base = static_cast<char*>(ids_.data());
  void* taken = base + ids_taken_;
  ids_taken_ += IdsBytes(count, dtype);
  DCHECK_LE(ids_taken_, ids_.TotalBytes());
  return taken;
}

float* PaddedBuffers::TakeWeights(int64_t count) {
  float* taken = static_cast<float*>(weights_.data()) + weights_taken_;
  weights_taken_ += count;
  DCHECK_LE(weights_taken_, weights_.NumElements());
  return taken;
}

int64_t* PaddedBuffers::TakeOffsets(int64_t count) {
  int64_t* taken = static_cast<int64_t*>(offsets_.data()) + offsets_taken_;
  offsets_taken_ += count;
  DCHECK_LE(offsets_taken_, offsets_.NumElements());
  return taken;
}

std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>>
LookupTableVariables(
    tensorflow::OpKernelContext* ctx,
    const std::vector<const tensorflow::ResourceHandle*>& handles) {
  std::vector<const tensorflow::ResourceHandle*> managed;
  std::vector<size_t> positions;
  for (size_t i = 0; i < handles.size(); ++i) {
    if (handles[i] != nullptr && !handles[i]->IsRefCounting()) {
      managed.push_back(handles[i]);
      positions.push_back(i);
    }
  }
  std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>> found;
  std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>> variables(
      handles.size());
  // Not OK: a handle of another device or type; all stay null, and each
  // feature's own lookup names it.
  if (managed.empty() ||
      !tensorflow::LookupResources(ctx, managed, &found).ok()) {
    return variables;
  }
  for (size_t j = 0; j < managed.size(); ++j) {
    variables[positions[j]] = std::move(found[j]);
  }
  return variables;
}

absl::Status ReadTableVariable(tensorflow::OpKernelContext* ctx,
                               const tensorflow::ResourceHandle& handle,
                               tensorflow::Var* found_variable, bool named,
                               tensorflow::DataType dtype, Tensor* value) {
  tensorflow::core::RefCountPtr<tensorflow::Var> variable;
  absl::Status found = absl::OkStatus();
  if (found_variable != nullptr) {
    found_variable->Ref();
    variable.reset(found_variable);
  } else {
    found = tensorflow::LookupResource(ctx, handle, &variable);
  }
  if (!found.ok() && named) {
    return absl::Status(
        found.code(),
        absl::StrCat("no table variable named '", handle.name(),
                     "' (attr table_names) in container '",
                     handle.container(), "' of this device's resource "
                     "manager: create or restore it before the call, in the "
                     "same session: ",
                     found.message()));
  }
  if (!found.ok()) {
    return absl::Status(
        found.code(),
        absl::StrCat("table variable not found (create and initialize or "
                     "restore it before the call): ",
                     found.message()));
  }
  if (variable->copy_on_read_mode.load()) {
    // A sparse op has touched the variable: in this mode sparse updates
    // write its buffer in place, so a reader sharing the buffer must turn
    // the mode off first (as DisableCopyOnRead, which read_value_no_copy
    // runs, does); a later sparse update then copies the buffer while
    // this call still holds it.
    tensorflow::mutex_lock exclusive(*variable->mu());
    variable->copy_on_read_mode.store(false);
  }
  tensorflow::tf_shared_lock lock(*variable->mu());
  if (!variable->is_initialized) {
    return absl::FailedPreconditionError(
        "table variable is not initialized: run its initializer (or restore "
        "its checkpoint) first");
  }
  const Tensor& held = *variable->tensor();
  if (held.dtype() != dtype) {
    return InvalidArgument("table variable holds ",
                           tensorflow::DataTypeString(held.dtype()),
                           " but attr table_dtypes says ",
                           tensorflow::DataTypeString(dtype));
  }
  *value = held;
  return absl::OkStatus();
}

absl::Status ReadFeatureBags(BagCount count, const Tensor* num_bags,
                             PaddedBuffers* padded, BatchedFeature* feature) {
  int64_t requested = count == BagCount::kRowsOfBags ? kRowsOfBags
                                                     : kRowsWithIds;
  if (count == BagCount::kGiven) {
    TF_RETURN_IF_ERROR(ReadNumSegments(*num_bags, "num_bags", &requested));
  }
  if (feature->kind != BagKind::kDense && feature->kind != BagKind::kPadded) {
    return ReadVectorBags(requested, feature);
  }
  TF_RETURN_IF_ERROR(ReadMatrixBags(requested, feature));
  return feature->kind == BagKind::kPadded ? PackPadded(padded, feature)
                                           : absl::OkStatus();
}

absl::Status CheckBags(const BatchedFeature& feature, int64_t* offsets) {
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
        for (int64_t b = 0; b <= feature.num_bags; ++b) {
          offsets[b] =
              feature.packed_offsets[std::min(b, feature.packed_rows)];
        }
      }
      return absl::OkStatus();
  }
  return absl::InternalError("unknown bag kind");
}

absl::Status CheckFeatureIds(const BatchedFeature& feature) {
  if (feature.kind == BagKind::kPadded) return absl::OkStatus();
  return CheckIds(
      *feature.ids, feature.table.rows,
      feature.kind == BagKind::kSegmentIds ? feature.bag_splits : nullptr);
}

}  // namespace tfce
