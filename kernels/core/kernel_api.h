// TF-free interface between the OpKernels and the per-ISA compute kernels.
//
// Every kernel variant in the dispatch table (kernel_scalar.cc, and one file
// per ISA) implements exactly these semantics; kernel_scalar.cc, the scalar
// reference, is the specification.
//
//   decode(r)[d] = value(r)[d] * scale(r) + bias(r)
//
// with, per storage format (tf_compressed_embedding/quantization.py is the
// one definition of each; record = the RecordBytes() bytes of row r):
//   kInt8Split    value int8 table[r][d], scale scales[r] (a separate
//                 array), no bias;
//   kFp16         value float16 table[r][d], scale 1, no bias;
//   kInt8Rowwise  record = [float32 scale][dim x int8 value];
//   kInt4Rowwise  record = [float16 scale][float16 bias][ceil(dim/2) bytes],
//                 value d in the low nibble of byte d/2 for even d, the
//                 high one for odd d, unsigned [0, 15].
// "No bias" means no add at all (not + 0: that would turn -0 into +0), and
// the decode is a multiply, then an add: two roundings, never an FMA.
//
//   Lookup:  for i in [begin, end):  out[i][:] = decode(ids[i])
//
//   Pool:    for b in [bag_begin, bag_end):   (out[b] = out + b * out_stride)
//              acc[:] = 0;  wsum = 0;  w2sum = 0
//              for i in [bag_offsets[b], bag_offsets[b+1]):
//                w = weights ? weights[i] : 1
//                acc[:] += (w * scale(ids[i])) * value(ids[i])[:]
//                          (= w * decode(ids[i]) up to rounding; the weight
//                          is folded into the scale, 1 for fp16, so every
//                          variant agrees where a product overflows; the
//                          decoded row is never stored)
//                bias_sum += w * bias(ids[i])       (formats with a bias)
//                wsum += w;  w2sum += w * w
//              acc[:] += bias_sum                   (formats with a bias)
//              denom = 1 (sum) | wsum (mean) | sqrt(w2sum) (sqrtn)
//              out[b][:] = denom == 0 ? 0 : acc[:] / denom
//
// Kernels never allocate, never throw and never see a TF type. They check
// every id with one unsigned compare and return false at the first id
// outside [0, rows); the caller then re-scans to build a precise error.
// Outputs may be partially written when a kernel returns false.
#ifndef TFCE_KERNELS_CORE_KERNEL_API_H_
#define TFCE_KERNELS_CORE_KERNEL_API_H_

#include <cstdint>

namespace tfce {

enum class Storage : int32_t {
  kInt8Split = 0,
  kFp16 = 1,
  kInt8Rowwise = 2,
  kInt4Rowwise = 3,
};
enum class Combiner : int32_t { kSum = 0, kMean = 1, kSqrtN = 2 };

// A compressed table of `rows` rows of `dim` values, row-major, each stored
// row RecordBytes(storage, dim) bytes at that stride. For kFp16 `data` holds
// IEEE binary16 bit patterns. `scales` is null for every format but
// kInt8Split.
struct TableView {
  Storage storage;
  const void* data;
  const float* scales;
  int64_t rows;
  int64_t dim;
};

// Ids are int32 or int64; the kernel specialises once per call, not per id.
struct IdsView {
  const void* data;
  bool is_int64;
};

struct LookupArgs {
  TableView table;
  IdsView ids;
  int64_t begin;  // positions [begin, end) of `ids` to decode
  int64_t end;
  float* out;             // [num_ids, dim]; only rows begin..end-1 are written
  int64_t prefetch_rows;  // ids ahead to prefetch (0: none); a hint only
};

struct PoolArgs {
  TableView table;
  IdsView ids;
  const float* weights;        // [num_ids], or null for unweighted
  const int64_t* bag_offsets;  // [num_bags + 1], non-decreasing, CSR form
  Combiner combiner;
  int64_t bag_begin;  // bags [bag_begin, bag_end) are computed
  int64_t bag_end;
  float* out;  // bag b's dim floats at out + b * out_stride
  // Floats from one bag's output row to the next: dim for a [num_bags, dim]
  // output, more when the rows are a column block of a wider matrix (the
  // batched op's concatenated output).
  int64_t out_stride;
  // How many ids ahead to prefetch rows (0: no prefetch). A hint: it never
  // changes results, and the reference kernel ignores it.
  int64_t prefetch_rows;
};

// Bytes of a rowwise record before its values (scale, or scale and bias).
constexpr int64_t kRecordHeaderBytes = 4;

// The largest dim a table may have: RecordBytes (and rows x it, for a
// table that fits in memory) then cannot overflow int64. A row of 2^40
// values is beyond any real embedding; the ops refuse larger dims.
constexpr int64_t kMaxDim = int64_t{1} << 40;

// Bytes of one stored row of `dim` values in `storage`: the table's stride.
// The separate scale of kInt8Split is not included (ScaleBytes).
constexpr int64_t RecordBytes(Storage storage, int64_t dim) {
  switch (storage) {
    case Storage::kInt8Split:
      return dim;
    case Storage::kFp16:
      return 2 * dim;
    case Storage::kInt8Rowwise:
      return kRecordHeaderBytes + dim;
    case Storage::kInt4Rowwise:
      return kRecordHeaderBytes + (dim + 1) / 2;
  }
  return 0;
}
inline int64_t RowBytes(const TableView& table) {
  return RecordBytes(table.storage, table.dim);
}
// Bytes of a row's separate scale (kInt8Split: one float32 per row).
inline int64_t ScaleBytes(const TableView& table) {
  return table.storage == Storage::kInt8Split ? 4 : 0;
}

using LookupFn = bool (*)(const LookupArgs&);
using PoolFn = bool (*)(const PoolArgs&);

}  // namespace tfce

#endif  // TFCE_KERNELS_CORE_KERNEL_API_H_
