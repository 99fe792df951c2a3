#include "kernels/tf/bag_inputs.h"

#include <algorithm>
#include <vector>

#include "absl/base/optimization.h"
#include "kernels/core/segment_offsets.h"
#include "kernels/tf/op_util.h"
#include "tensorflow/core/framework/bounds_check.h"
#include "tensorflow/core/util/util.h"

namespace tfce {

using ::tensorflow::Tensor;

namespace {

// The op's message for segment ids SegmentOffsets refused.
absl::Status SegmentIdsError(const SegmentIdsCheck& check,
                             int64_t num_segments) {
  switch (check.problem) {
    case SegmentIdsCheck::Problem::kNone:
      return absl::OkStatus();
    case SegmentIdsCheck::Problem::kOutOfRange:
      return InvalidArgument("segment_ids[", check.position,
                             "] = ", check.value, " is not in [0, ",
                             num_segments,
                             "): segment ids must be >= 0 and < num_segments");
    case SegmentIdsCheck::Problem::kUnsorted:
      return InvalidArgument("segment_ids are not sorted: segment_ids[",
                             check.position - 1, "] = ", check.previous,
                             " > segment_ids[", check.position,
                             "] = ", check.value);
    case SegmentIdsCheck::Problem::kChangedWhileRead:
      break;
  }
  return absl::InternalError("segment_ids changed while the op read them");
}

template <typename Split>
absl::Status CopyRowSplits(const Split* splits, int64_t size, int64_t num_ids,
                           int64_t* offsets) {
  std::vector<int64_t> scratch;
  if (offsets == nullptr) {
    scratch.resize(size);
    offsets = scratch.data();
  }
  for (int64_t i = 0; i < size; ++i) {
    offsets[i] = static_cast<int64_t>(splits[i]);
  }
  if (offsets[0] != 0) {
    return InvalidArgument("row_splits[0] = ", offsets[0],
                           " must be 0: row splits start at 0");
  }
  for (int64_t i = 1; i < size; ++i) {
    if (offsets[i] < offsets[i - 1]) {
      return InvalidArgument("row_splits are not sorted: row_splits[", i - 1,
                             "] = ", offsets[i - 1], " > row_splits[", i,
                             "] = ", offsets[i]);
    }
  }
  if (offsets[size - 1] != num_ids) {
    return InvalidArgument("row_splits[", size - 1, "] = ", offsets[size - 1],
                           " must be the number of ids, ", num_ids,
                           ": the last row split ends the last row");
  }
  return absl::OkStatus();
}

// Bytes of ids PackPadded keeps requested ahead of the row it packs. A
// request's ids were often written long before the call (a feed's tensors,
// a batch assembled elsewhere), so each feature's ids would otherwise wait
// on memory line by line: a feature's few rows are too short a stream for
// the hardware prefetcher to run ahead of.
constexpr int64_t kPackPrefetchBytes = 1024;
constexpr int64_t kCacheLineBytes = 64;

// Every id is written at the next free slot before it is known to be kept
// (n <= the index read, within the buffer's rows * width), and the slot
// advances only past ids >= 0: no branch on the padding, which comes in no
// pattern a branch predictor learns.
template <typename Index, bool kWeighted>
absl::Status PackPadded(const Tensor& ids, const Tensor& weights,
                        int64_t table_rows, void* packed_ids,
                        float* packed_weights, int64_t* offsets,
                        int64_t* rows_with_ids) {
  const int64_t rows = ids.dim_size(0), width = ids.dim_size(1);
  const Index* in = ids.flat<Index>().data();
  const float* in_weights = kWeighted ? weights.flat<float>().data() : nullptr;
  Index* out = static_cast<Index*>(packed_ids);
  const char* const in_end = reinterpret_cast<const char*>(in + rows * width);
  const char* requested = reinterpret_cast<const char*>(in);
  int64_t n = 0;
  offsets[0] = 0;
  *rows_with_ids = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const char* const ahead = std::min(
        in_end,
        reinterpret_cast<const char*>(in + (r + 1) * width) +
            kPackPrefetchBytes);
    for (; requested < ahead; requested += kCacheLineBytes) {
      __builtin_prefetch(requested);
    }
    for (int64_t i = r * width; i < (r + 1) * width; ++i) {
      const Index id = tensorflow::internal::SubtleMustCopy(in[i]);
      if (ABSL_PREDICT_FALSE(id >= table_rows)) {
        return InvalidArgument(
            "ids", tensorflow::SliceDebugString(ids.shape(), i), " = ", id,
            " is not in [0, ", table_rows, "): the table has ", table_rows,
            " rows (ids < 0 are padding)");
      }
      out[n] = id;
      if (kWeighted) packed_weights[n] = in_weights[i];
      n += id >= 0;
    }
    offsets[r + 1] = n;
    if (n > offsets[r]) *rows_with_ids = r + 1;
  }
  return absl::OkStatus();
}

}  // namespace

void PrefetchPaddedIds(const Tensor& ids) {
  const char* data = static_cast<const char*>(ids.data());
  const int64_t bytes =
      std::min<int64_t>(ids.TotalBytes(), kPackPrefetchBytes);
  for (int64_t b = 0; b < bytes; b += kCacheLineBytes) {
    __builtin_prefetch(data + b);
  }
}

absl::Status PackPaddedIds(const Tensor& ids, const Tensor& weights,
                           int64_t table_rows, void* packed_ids,
                           float* packed_weights, int64_t* offsets,
                           int64_t* rows_with_ids) {
  const bool weighted = weights.dims() == 2;
  const bool int32 = ids.dtype() == tensorflow::DT_INT32;
  auto pack = int32 ? (weighted ? PackPadded<int32_t, true>
                                : PackPadded<int32_t, false>)
                    : (weighted ? PackPadded<int64_t, true>
                                : PackPadded<int64_t, false>);
  return pack(ids, weights, table_rows, packed_ids, packed_weights, offsets,
              rows_with_ids);
}

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

absl::Status ReadNumSegments(const Tensor& t, const char* name,
                             int64_t* num_segments) {
  if (t.dims() != 0) {
    return InvalidArgument(name, " must be a scalar, not shape ",
                           t.shape().DebugString());
  }
  const int64_t n = IntScalar(t);
  if (n < 0) {
    return InvalidArgument(name, " = ", n, " must be >= 0");
  }
  *num_segments = n;
  return absl::OkStatus();
}

absl::Status SegmentIdsToOffsets(const Tensor& segment_ids,
                                 int64_t num_segments, int64_t* offsets) {
  const int64_t n = segment_ids.NumElements();
  const SegmentIdsCheck check =
      segment_ids.dtype() == tensorflow::DT_INT32
          ? tfce::SegmentOffsets(segment_ids.flat<int32_t>().data(), n,
                                 num_segments, offsets)
          : tfce::SegmentOffsets(segment_ids.flat<int64_t>().data(), n,
                                 num_segments, offsets);
  return SegmentIdsError(check, num_segments);
}

absl::Status RowSplitsToOffsets(const Tensor& row_splits, int64_t num_ids,
                                int64_t* offsets) {
  const int64_t size = row_splits.NumElements();
  if (row_splits.dims() != 1 || size < 1) {
    return InvalidArgument(
        "row_splits must be a vector of at least one element (rows + 1), "
        "but has shape ",
        row_splits.shape().DebugString());
  }
  return row_splits.dtype() == tensorflow::DT_INT32
             ? CopyRowSplits(row_splits.flat<int32_t>().data(), size, num_ids,
                             offsets)
             : CopyRowSplits(row_splits.flat<int64_t>().data(), size, num_ids,
                             offsets);
}

}  // namespace tfce
