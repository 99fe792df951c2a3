#include "kernels/core/batched_pool.h"

#include <algorithm>
#include <cmath>

namespace tfce {
namespace {

int64_t IdsOf(const PoolArgs& f, int64_t bag_begin, int64_t bag_end) {
  return f.bag_offsets[bag_end] - f.bag_offsets[bag_begin];
}

int64_t IdAt(const IdsView& ids, int64_t i) {
  return ids.is_int64 ? static_cast<const int64_t*>(ids.data)[i]
                      : static_cast<const int32_t*>(ids.data)[i];
}

// Requests row `id` of `t` (its every cache line, and its separate scale)
// into the cache. Plain prefetcht0 (baseline x86-64): this file has no ISA
// flags, and the rows are the same bytes whichever variant pools them.
// Always inlined: GCC sees no effect in an out-of-line function that only
// prefetches, and deletes every call to it.
[[gnu::always_inline]] inline void PrefetchRow(const TableView& t, int64_t id) {
  if (static_cast<uint64_t>(id) >= static_cast<uint64_t>(t.rows)) return;
  const int64_t bytes = RowBytes(t);
  if (bytes > 0) {
    const char* row = static_cast<const char*>(t.data) + id * bytes;
    for (int64_t off = 0; off < bytes; off += 64) {
      __builtin_prefetch(row + off, 0, 3);
    }
    __builtin_prefetch(row + bytes - 1, 0, 3);  // it may straddle one more
  }
  if (t.scales != nullptr) __builtin_prefetch(t.scales + id, 0, 3);
}

// The ids of a tile that the cross-tile prefetch requests: its first ones,
// as many as its kernel would prefetch at its start.
int64_t RowsToPrefetch(const PoolArgs& f, const PoolTile& tile) {
  return std::min({IdsOf(f, tile.bag_begin, tile.bag_end), f.prefetch_rows,
                   kCrossTilePrefetchRows});
}

}  // namespace

std::vector<PoolTile> PlanPoolTiles(const PoolArgs* features,
                                    int64_t num_features, double tile_cost) {
  std::vector<PoolTile> tiles;
  for (int64_t f = 0; f < num_features; ++f) {
    const PoolArgs& a = features[f];
    const int64_t bags = a.bag_end - a.bag_begin;
    if (bags <= 0) continue;
    const int64_t ids = IdsOf(a, a.bag_begin, a.bag_end);
    const double cost = PoolCost(ids, bags, a.table.dim);
    const int64_t pieces =
        tile_cost <= 0
            ? 1
            : std::min<int64_t>(
                  bags, std::max<int64_t>(1, static_cast<int64_t>(
                                                 std::ceil(cost / tile_cost))));
    // Each cut splits the cost left evenly over the pieces left, at the bag
    // boundary nearest to that share; a tile's bags are never empty.
    // cost_to(b): the cost of bags [bag_begin, b), which grows with b.
    auto cost_to = [&a](int64_t b) {
      return PoolCost(a.bag_offsets[b] - a.bag_offsets[a.bag_begin],
                      b - a.bag_begin, a.table.dim);
    };
    int64_t begin = a.bag_begin;
    for (int64_t left = pieces; left > 0 && begin < a.bag_end; --left) {
      int64_t end = a.bag_end;
      if (left > 1) {
        const double target = cost_to(begin) + (cost - cost_to(begin)) /
                                                   static_cast<double>(left);
        int64_t lo = begin + 1, hi = a.bag_end;  // first b with cost >= target
        while (lo < hi) {
          const int64_t mid = lo + (hi - lo) / 2;
          if (cost_to(mid) < target) {
            lo = mid + 1;
          } else {
            hi = mid;
          }
        }
        end = lo;
        if (end - 1 > begin &&
            target - cost_to(end - 1) < cost_to(end) - target) {
          --end;
        }
      }
      tiles.push_back(PoolTile{f, begin, end});
      begin = end;
    }
  }
  return tiles;
}

bool RunPoolTiles(PoolFn pool, const PoolArgs* features, const PoolTile* tiles,
                  int64_t begin, int64_t end, int64_t* bad_feature) {
  int64_t next = begin + 1;  // the first tile whose rows are not requested
  int64_t in_flight = 0;     // rows requested for tiles [t + 1, next)
  for (int64_t t = begin; t < end; ++t) {
    if (t < next && t > begin) {
      in_flight -= RowsToPrefetch(features[tiles[t].feature], tiles[t]);
    }
    next = std::max(next, t + 1);
    while (next < end && in_flight < kCrossTilePrefetchRows) {
      const PoolArgs& f = features[tiles[next].feature];
      const int64_t rows = RowsToPrefetch(f, tiles[next]);
      const int64_t first = f.bag_offsets[tiles[next].bag_begin];
      for (int64_t i = first; i < first + rows; ++i) {
        PrefetchRow(f.table, IdAt(f.ids, i));
      }
      in_flight += rows;
      ++next;
    }
    PoolArgs args = features[tiles[t].feature];
    args.bag_begin = tiles[t].bag_begin;
    args.bag_end = tiles[t].bag_end;
    if (!pool(args)) {
      *bad_feature = tiles[t].feature;
      return false;
    }
  }
  return true;
}

}  // namespace tfce
