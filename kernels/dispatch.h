// The one dispatch table: which kernel set runs, chosen once per process.
#ifndef TFCE_KERNELS_DISPATCH_H_
#define TFCE_KERNELS_DISPATCH_H_

#include <cstdint>
#include <string>

#include "kernels/kernel_api.h"

namespace tfce {

struct KernelSet {
  const char* isa;            // the TFCE_ISA name of this row
  bool (*cpu_supports)();     // can this CPU+OS run the row?
  LookupFn lookup;
  PoolFn pool;
};

// All rows, best first; the last row is the scalar reference.
const KernelSet* KernelTable(int* num_rows);

// The row used by the ops: TFCE_ISA if set, else the best row the CPU
// supports. Returns null and sets *error when TFCE_ISA names an unknown row
// or one this CPU cannot run. Decided once; later calls return the same.
const KernelSet* SelectedKernels(std::string* error);

// How many ids ahead the lookup kernels prefetch rows: TFCE_PREFETCH_ROWS if
// set (0 disables; read once per process), else kDefaultPrefetchRows.
constexpr int64_t kDefaultPrefetchRows = 16;
int64_t PrefetchRows();

// The same for the pooling kernels on `table` with bags of `ids_per_bag` ids
// on average: TFCE_PREFETCH_ROWS if set, else 0 when the bags are long
// (kLongBagIds or more) and the table stays in cache (at most
// kCachedTableL2Multiple x one core's L2) with rows under a cache line; else
// kDefaultPrefetchRows. There the prefetches only cost instructions (up to
// 1.7x slower), while short bags, long rows and tables beyond the cache need
// them (up to 3.6x faster): `python benchmarks/prefetch_policy.py`. The
// lookup (one row per output) showed no gain from turning them off
// (0.92-1.03x) and keeps the fixed distance.
constexpr double kLongBagIds = 8;
constexpr int64_t kCachedTableL2Multiple = 8;
int64_t PoolPrefetchRows(const TableView& table, double ids_per_bag);

}  // namespace tfce

#endif  // TFCE_KERNELS_DISPATCH_H_
