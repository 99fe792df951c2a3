#include "kernels/core/prefetch_policy.h"

#include <cmath>
#include <cstdint>

#include "kernels/core/cpu_features.h"
#include "kernels/core/tuning_env.h"

namespace tfce {
namespace {

// TFCE_PREFETCH_ROWS (whole rows, at most 4096), or -1 if unset or not a
// whole number.
int64_t ForcedPrefetchRows() {
  static const int64_t forced = [] {
    const double rows = TuningEnv("TFCE_PREFETCH_ROWS", -1, 4096);
    return rows == std::floor(rows) ? static_cast<int64_t>(rows) : int64_t{-1};
  }();
  return forced;
}

}  // namespace

int64_t PrefetchRows() {
  const int64_t forced = ForcedPrefetchRows();
  return forced >= 0 ? forced : kDefaultPrefetchRows;
}

int64_t PrefetchDistance(const TableView& table) {
  return PrefetchDistance(RowBytes(table), ScaleBytes(table) > 0);
}

int64_t PrefetchDistance(int64_t row_bytes, bool scale_line) {
  const double lines =
      static_cast<double>(row_bytes) / 64 + 1 + (scale_line ? 1 : 0);
  const double rows = kPrefetchLines / lines;
  if (rows <= kMinPrefetchRows) return kMinPrefetchRows;
  if (rows >= kMaxPrefetchRows) return kMaxPrefetchRows;
  return static_cast<int64_t>(rows);
}

int64_t PoolPrefetchRows(const TableView& table, double ids_per_bag) {
  const int64_t forced = ForcedPrefetchRows();
  if (forced >= 0) return forced;
  if (ids_per_bag >= kLongBagIds && RowBytes(table) < 64) {
    // In doubles: rows * bytes of a view may exceed int64 in principle.
    const double table_bytes =
        static_cast<double>(table.rows) * (RowBytes(table) + ScaleBytes(table));
    if (table_bytes <= static_cast<double>(kCachedTableL2Multiple) *
                           GetCpuFeatures().l2_cache_bytes) {
      return 0;
    }
  }
  return PrefetchDistance(table);
}

}  // namespace tfce
