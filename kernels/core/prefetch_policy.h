// How many ids ahead the kernels prefetch table rows (PoolArgs and
// LookupArgs::prefetch_rows). A hint: it never changes results.
// benchmarks/prefetch_policy.py measures each rule below against the
// alternatives on this machine (results in benchmarks/RESULTS.md).
#ifndef TFCE_KERNELS_CORE_PREFETCH_POLICY_H_
#define TFCE_KERNELS_CORE_PREFETCH_POLICY_H_

#include <cstdint>

#include "kernels/core/kernel_api.h"

namespace tfce {

// The lookup's distance: TFCE_PREFETCH_ROWS if set (0 disables; read once
// per process), else kDefaultPrefetchRows. One distance for every table:
// turning it off gained the lookup nothing (measured by benchmarks/op_bench.py
// with TFCE_PREFETCH_ROWS=0; history in CHANGELOG.md).
constexpr int64_t kDefaultPrefetchRows = 16;
int64_t PrefetchRows();

// Rows ahead for the pooling kernels on a table beyond the cache: enough
// that about kPrefetchLines cache lines are in flight. A random row of B
// bytes touches B / 64 + 1 lines on average (it may straddle one more), an
// int8_split row one more for its scale: 128 rows for int8 dim 12, 116 for
// fp16 dim 12, 52 for int8 dim 128, within [kMinPrefetchRows,
// kMaxPrefetchRows]. Short rows need more rows in flight to keep the core's
// miss buffers busy; long rows' own lines already fill them. The lines in
// flight are those at which touching a table's random rows
// (benchmarks/gather_limit.py) and the kernel itself
// (benchmarks/prefetch_policy.py, benchmarks/ladder.py's sweep) stop getting
// faster.
constexpr double kPrefetchLines = 160;
constexpr int64_t kMinPrefetchRows = 8;
constexpr int64_t kMaxPrefetchRows = 128;
int64_t PrefetchDistance(const TableView& table);
// The same rule for any row of `row_bytes`, with or without a separate scale
// line (the ladder's FP32 baseline uses it too).
int64_t PrefetchDistance(int64_t row_bytes, bool scale_line);

// The distance the pooling kernels use on `table` with bags of `ids_per_bag`
// ids on average: TFCE_PREFETCH_ROWS if set, else 0 when the bags are long
// (kLongBagIds or more) and the table stays in cache (at most
// kCachedTableL2Multiple x one core's L2) with rows under a cache line,
// else PrefetchDistance(table). There the rows are already in cache and the
// prefetches only cost instructions; short bags, long rows and tables beyond
// the cache need them.
constexpr double kLongBagIds = 8;
constexpr int64_t kCachedTableL2Multiple = 8;
int64_t PoolPrefetchRows(const TableView& table, double ids_per_bag);

}  // namespace tfce

#endif  // TFCE_KERNELS_CORE_PREFETCH_POLICY_H_
