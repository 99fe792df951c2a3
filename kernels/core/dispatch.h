// The one dispatch table: which kernel set runs, chosen once per process.
#ifndef TFCE_KERNELS_CORE_DISPATCH_H_
#define TFCE_KERNELS_CORE_DISPATCH_H_

#include <cstdint>
#include <string>

#include "kernels/core/kernel_api.h"

namespace tfce {

struct KernelSet {
  const char* isa;            // the TFCE_ISA name of this row
  bool (*cpu_supports)();     // can this CPU+OS run the row?
  LookupFn lookup;
  PoolFn pool;
};

// All rows, best first; the last row is the scalar reference.
const KernelSet* KernelTable(int* num_rows);

// The rows this CPU can run, best first, comma-separated (what TFCE_ISA
// accepts); rows named in TFCE_HIDE_ISA (a test hook) count as unsupported.
std::string SupportedRowNames();

// The row used by the ops: TFCE_ISA if set, else the best row the CPU
// supports. Returns null and sets *error when TFCE_ISA names an unknown row
// or one this CPU cannot run. Decided once; later calls return the same.
const KernelSet* SelectedKernels(std::string* error);

// Bytes of one stored row of `table`, and of its separate scale (int8: one
// float32 per row; fp16: none).
int64_t RowBytes(const TableView& table);
int64_t ScaleBytes(const TableView& table);

// How many ids ahead the lookup kernels prefetch rows: TFCE_PREFETCH_ROWS if
// set (0 disables; read once per process), else kDefaultPrefetchRows. (The
// lookup showed no gain from turning them off, 0.92-1.03x.)
constexpr int64_t kDefaultPrefetchRows = 16;
int64_t PrefetchRows();

// Rows ahead for the pooling kernels on a table beyond the cache: enough
// that about kPrefetchLines cache lines are in flight. A random row of B
// bytes touches B / 64 + 1 lines on average (it may straddle one more), an
// int8 row one more for its scale: 29 rows for int8 dim 12, 46 for fp16 dim
// 12, 16 for int8 dim 128, within [kMinPrefetchRows, kMaxPrefetchRows].
// Short rows gain from more rows in flight (fp16 dim 12-32: up to 1.4x over
// 16 ahead), long rows do not (their lines already fill the miss buffers):
// `python benchmarks/prefetch_policy.py`.
constexpr double kPrefetchLines = 64;
constexpr int64_t kMinPrefetchRows = 8;
constexpr int64_t kMaxPrefetchRows = 48;
int64_t PrefetchDistance(const TableView& table);
// The same rule for any row of `row_bytes`, with or without a separate scale
// line (the ladder's FP32 baseline uses it too).
int64_t PrefetchDistance(int64_t row_bytes, bool scale_line);

// The distance the pooling kernels use on `table` with bags of `ids_per_bag`
// ids on average: TFCE_PREFETCH_ROWS if set, else 0 when the bags are long
// (kLongBagIds or more) and the table stays in cache (at most
// kCachedTableL2Multiple x one core's L2) with rows under a cache line,
// else PrefetchDistance(table). There the prefetches only cost instructions
// (up to 1.7x slower), while short bags, long rows and tables beyond the
// cache need them (up to 3.6x faster).
constexpr double kLongBagIds = 8;
constexpr int64_t kCachedTableL2Multiple = 8;
int64_t PoolPrefetchRows(const TableView& table, double ids_per_bag);

}  // namespace tfce

#endif  // TFCE_KERNELS_CORE_DISPATCH_H_
