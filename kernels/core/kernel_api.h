// TF-free interface between the OpKernels and the per-ISA compute kernels.
//
// Every kernel variant in the dispatch table (kernel_scalar.cc, and one file
// per ISA) implements exactly these semantics; kernel_scalar.cc, the scalar
// reference, is the specification.
//
//   decode(r)[d] = float(table_int8[r][d]) * scales[r]      (Storage::kInt8)
//   decode(r)[d] = float(table_fp16[r][d])                  (Storage::kFp16)
//
//   Lookup:  for i in [begin, end):  out[i][:] = decode(ids[i])
//
//   Pool:    for b in [bag_begin, bag_end):
//              acc[:] = 0;  wsum = 0;  w2sum = 0
//              for i in [bag_offsets[b], bag_offsets[b+1]):
//                w = weights ? weights[i] : 1
//                acc[:] += (w * scale(ids[i])) * value(ids[i])[:]
//                          (= w * decode(ids[i]) up to rounding; the weight
//                          is folded into the scale, 1 for fp16, so every
//                          variant agrees where a product overflows; the
//                          decoded row is never stored)
//                wsum += w;  w2sum += w * w
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

enum class Storage : int32_t { kInt8 = 0, kFp16 = 1 };
enum class Combiner : int32_t { kSum = 0, kMean = 1, kSqrtN = 2 };

// A compressed table, row-major [rows, dim]. For kFp16, `data` holds IEEE
// binary16 bit patterns and `scales` is null.
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
  float* out;  // [num_bags, dim]
  // How many ids ahead to prefetch rows (0: no prefetch). A hint: it never
  // changes results, and the reference kernel ignores it.
  int64_t prefetch_rows;
};

// Bytes of one stored row of `table`, and of its separate scale (int8: one
// float32 per row; fp16: none).
inline int64_t RowBytes(const TableView& table) {
  return table.dim * (table.storage == Storage::kInt8 ? 1 : 2);
}
inline int64_t ScaleBytes(const TableView& table) {
  return table.storage == Storage::kInt8 ? 4 : 0;
}

using LookupFn = bool (*)(const LookupArgs&);
using PoolFn = bool (*)(const PoolArgs&);

}  // namespace tfce

#endif  // TFCE_KERNELS_CORE_KERNEL_API_H_
