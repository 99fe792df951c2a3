// The pooling ops' bag inputs: the combiner attr, num_segments, and the bag
// structure (sorted segment ids, or row splits) turned into the CSR offsets
// the kernels take (PoolArgs::bag_offsets), with the ops' error messages.
#ifndef TFCE_KERNELS_TF_BAG_INPUTS_H_
#define TFCE_KERNELS_TF_BAG_INPUTS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/core/kernel_api.h"
#include "tensorflow/core/framework/tensor.h"

namespace tfce {

// 'sum', 'mean' or 'sqrtn' as a Combiner; anything else is an error.
absl::Status ParseCombiner(const std::string& name, Combiner* combiner);

// A scalar int32/int64 tensor >= 0 (`name` says which input it is).
absl::Status ReadNumSegments(const tensorflow::Tensor& t, const char* name,
                             int64_t* num_segments);

// Checks segment_ids (sorted, in [0, num_segments)) and, unless offsets is
// null, writes their CSR offsets[0..num_segments] (core/segment_offsets.h).
absl::Status SegmentIdsToOffsets(const tensorflow::Tensor& segment_ids,
                                 int64_t num_segments, int64_t* offsets);

// Copies row_splits (int32/int64 [num_bags + 1]) to offsets[0..num_bags]
// and checks the copy, which the kernels then read (a concurrent change of
// the input cannot make them read out of bounds): it must start at 0, never
// decrease, and end at num_ids. `offsets` may be null (check only).
absl::Status RowSplitsToOffsets(const tensorflow::Tensor& row_splits,
                                int64_t num_ids, int64_t* offsets);

// Padded ids ([rows, width] int32/int64; entries < 0 are padding) as one
// bag per row: copies row r's ids >= 0, in order, to packed_ids (and, when
// weights is [rows, width], their weights to packed_weights), writes
// offsets[0..rows] and sets *rows_with_ids to the last row holding an id
// + 1 (0 for none). packed_ids has room for rows * width ids of ids' dtype,
// packed_weights (null when unweighted) for as many floats. An id >=
// table_rows is an error naming its position. The copies are what the
// kernels read, so a concurrent change of the inputs cannot make them read
// out of bounds.
absl::Status PackPaddedIds(const tensorflow::Tensor& ids,
                           const tensorflow::Tensor& weights,
                           int64_t table_rows, void* packed_ids,
                           float* packed_weights, int64_t* offsets,
                           int64_t* rows_with_ids);

// Requests the first ids PackPaddedIds would request ahead of its first
// row: a caller packing many features calls it for the next feature before
// it packs this one, so that feature's first rows are on their way.
void PrefetchPaddedIds(const tensorflow::Tensor& ids);

}  // namespace tfce

#endif  // TFCE_KERNELS_TF_BAG_INPUTS_H_
