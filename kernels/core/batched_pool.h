// Pooling many tables in one call, TF-free: the batched op's work is a list
// of features (one PoolArgs each, over all of that feature's bags), cut into
// tiles of consecutive bags of one feature that threads run independently.
//
// A bag is never split, and each bag is computed by one call of the pool
// kernel whatever the tiles are, so results do not depend on the tiling nor
// on the thread count (the kernels' result for a bag does not depend on
// which bags share its call).
#ifndef TFCE_KERNELS_CORE_BATCHED_POOL_H_
#define TFCE_KERNELS_CORE_BATCHED_POOL_H_

#include <cstdint>
#include <vector>

#include "kernels/core/kernel_api.h"

namespace tfce {

// Bags [bag_begin, bag_end) of feature `feature`.
struct PoolTile {
  int64_t feature;
  int64_t bag_begin;
  int64_t bag_end;
};

// The estimated cost (~cycles) of pooling `ids` ids into `bags` bags of
// `dim` values: the row work of each id plus writing each bag's output.
// The single-table op uses the same estimate to decide its threading.
inline double PoolCost(int64_t ids, int64_t bags, int64_t dim) {
  return static_cast<double>(ids) * static_cast<double>(dim * 2 + 20) +
         static_cast<double>(bags) * static_cast<double>(dim + 8);
}

// Cuts each feature's bags [bag_begin, bag_end) into tiles of about equal
// cost (PoolCost), about `tile_cost` each (a bag costing more is a tile of
// its own), in feature order; features without bags give no tile.
// `tile_cost` <= 0 makes one tile per feature.
std::vector<PoolTile> PlanPoolTiles(const PoolArgs* features,
                                    int64_t num_features, double tile_cost);

// Rows of the next tiles' first ids that RunPoolTiles keeps in flight while
// it pools the current tile: with bags of a few ids each tile is too short
// for the kernel's own prefetch to run ahead of its loads, so the rows of
// the tiles after it are requested early, across tables.
constexpr int64_t kCrossTilePrefetchRows = 16;

// Pools tiles [begin, end) with `pool`, each with its feature's args; while
// pooling a tile, the first rows of the following tiles (up to
// kCrossTilePrefetchRows of them, no more per tile than that feature's
// prefetch_rows) are prefetched. Returns false at the first tile whose
// kernel returned false (a bad id) and sets *bad_feature to its feature.
bool RunPoolTiles(PoolFn pool, const PoolArgs* features, const PoolTile* tiles,
                  int64_t begin, int64_t end, int64_t* bad_feature);

}  // namespace tfce

#endif  // TFCE_KERNELS_CORE_BATCHED_POOL_H_
