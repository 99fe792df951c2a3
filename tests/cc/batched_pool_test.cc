// The batched op's core (kernels/core/batched_pool.h): tiles cover every
// bag of every feature exactly once, in order; running them, in any split
// over callers, gives the pool kernel's own result bit for bit on every
// variant this CPU can run; a bad id in any tile is reported with its
// feature; prefetching the next tiles' rows never reads a bad id's row.
#include "kernels/core/batched_pool.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/dispatch.h"
#include "kernels/core/kernel_api.h"
#include "tests/cc/kernel_test_util.h"

namespace tfce {
namespace testing {
namespace {

// A feature: its table, ids, bags and output, and the PoolArgs over them.
struct Feature {
  Table table;
  std::vector<int64_t> ids;
  std::vector<int64_t> offsets;
  std::vector<float> out;
  PoolArgs Args(int64_t prefetch_rows) {
    PoolArgs a{};
    a.table = table.View();
    a.ids = IdsView{ids.data(), true};
    a.bag_offsets = offsets.data();
    a.combiner = Combiner::kMean;
    a.bag_begin = 0;
    a.bag_end = static_cast<int64_t>(offsets.size()) - 1;
    a.out = out.data();
    a.out_stride = table.dim;
    a.prefetch_rows = prefetch_rows;
    return a;
  }
};

Feature MakeFeature(Storage storage, int64_t dim, int64_t bags, int64_t max_len,
                    std::mt19937* rng) {
  Feature f{MakeTable(storage, 41, dim, rng), {}, {0}, {}};
  std::uniform_int_distribution<int64_t> len(0, max_len), id(0, 40);
  for (int64_t b = 0; b < bags; ++b) {
    const int64_t n = len(*rng);
    for (int64_t i = 0; i < n; ++i) f.ids.push_back(id(*rng));
    f.offsets.push_back(static_cast<int64_t>(f.ids.size()));
  }
  f.out.assign(bags * dim, -1.0f);
  return f;
}

std::vector<Feature> MakeFeatures(std::mt19937* rng) {
  std::vector<Feature> features;
  const auto storages = AllStorages();
  // Bags of one id (the serving case), long bags, a feature of no bags, and
  // a feature whose bags are all empty.
  const int64_t shapes[][3] = {{12, 1, 1},   {3, 257, 1}, {33, 40, 30},
                               {8, 0, 5},    {16, 60, 0}, {1, 200, 3},
                               {64, 9, 100}, {13, 300, 2}};
  int k = 0;
  for (const auto& s : shapes) {
    features.push_back(
        MakeFeature(storages[k++ % storages.size()], s[0], s[1], s[2], rng));
  }
  return features;
}

std::vector<PoolArgs> ArgsOf(std::vector<Feature>* features,
                             int64_t prefetch_rows) {
  std::vector<PoolArgs> args;
  for (Feature& f : *features) args.push_back(f.Args(prefetch_rows));
  return args;
}

TEST(PlanPoolTilesTest, TilesCoverEveryBagOnceInOrder) {
  std::mt19937 rng(7);
  std::vector<Feature> features = MakeFeatures(&rng);
  const std::vector<PoolArgs> args = ArgsOf(&features, 4);
  for (double tile_cost : {0.0, 1.0, 500.0, 5e3, 1e5, 1e12}) {
    const std::vector<PoolTile> tiles =
        PlanPoolTiles(args.data(), args.size(), tile_cost);
    size_t t = 0;
    for (int64_t f = 0; f < static_cast<int64_t>(args.size()); ++f) {
      int64_t next = 0;
      int64_t pieces = 0;
      for (; t < tiles.size() && tiles[t].feature == f; ++t, ++pieces) {
        EXPECT_EQ(tiles[t].bag_begin, next) << "feature " << f;
        EXPECT_GT(tiles[t].bag_end, tiles[t].bag_begin) << "an empty tile";
        next = tiles[t].bag_end;
      }
      EXPECT_EQ(next, args[f].bag_end) << "feature " << f << " not covered";
      if (tile_cost <= 0 || tile_cost >= 1e12) {
        EXPECT_EQ(pieces, args[f].bag_end > 0 ? 1 : 0) << "feature " << f;
      }
    }
    EXPECT_EQ(t, tiles.size()) << "tiles out of feature order";
  }
}

TEST(PlanPoolTilesTest, SplitsByIdsAndKeepsABigBagWhole) {
  std::mt19937 rng(8);
  Feature f = MakeFeature(Storage::kFp16, 16, 0, 0, &rng);
  // 100 bags of 1 id, then one bag of 10000 ids, then 100 of 1.
  for (int64_t b = 0; b < 201; ++b) {
    const int64_t n = b == 100 ? 10000 : 1;
    for (int64_t i = 0; i < n; ++i) f.ids.push_back(1);
    f.offsets.push_back(static_cast<int64_t>(f.ids.size()));
  }
  f.out.assign(201 * 16, 0.0f);
  const PoolArgs args = f.Args(0);
  const double total = PoolCost(f.ids.size(), 201, 16);
  const std::vector<PoolTile> tiles = PlanPoolTiles(&args, 1, total / 8);
  ASSERT_GE(tiles.size(), 2u);
  bool alone = false;
  for (const PoolTile& t : tiles) {
    alone |= t.bag_begin == 100 && t.bag_end == 101;
  }
  EXPECT_TRUE(alone) << "the big bag shares its tile with most other bags";
}

class RunPoolTilesTest : public ::testing::TestWithParam<int> {};

TEST_P(RunPoolTilesTest, AnySplitEqualsOneKernelCallPerFeature) {
  TFCE_SELECT_VARIANT_OR_SKIP(GetParam());
  std::mt19937 rng(9);
  std::vector<Feature> features = MakeFeatures(&rng);
  std::vector<std::vector<float>> want;
  for (Feature& f : features) {
    ASSERT_TRUE(variant.pool(f.Args(0)));
    want.push_back(f.out);
  }
  for (int64_t prefetch : {0, 1, 3, 200}) {
    for (double tile_cost : {0.0, 50.0, 3e3}) {
      for (Feature& f : features) f.out.assign(f.out.size(), -1.0f);
      std::vector<PoolArgs> args = ArgsOf(&features, prefetch);
      const std::vector<PoolTile> tiles =
          PlanPoolTiles(args.data(), args.size(), tile_cost);
      // Tiles run in three uneven calls, as threads take chunks.
      const int64_t n = static_cast<int64_t>(tiles.size());
      const int64_t cuts[] = {0, n / 5, n / 2 + 1 > n ? n : n / 2 + 1, n};
      for (int c = 0; c < 3; ++c) {
        int64_t bad = -1;
        ASSERT_TRUE(RunPoolTiles(variant.pool, args.data(), tiles.data(),
                                 cuts[c], cuts[c + 1], &bad));
      }
      for (size_t f = 0; f < features.size(); ++f) {
        EXPECT_EQ(features[f].out, want[f])
            << "feature " << f << ", prefetch " << prefetch << ", tile cost "
            << tile_cost;
      }
    }
  }
}

TEST_P(RunPoolTilesTest, BadIdNamesItsFeature) {
  TFCE_SELECT_VARIANT_OR_SKIP(GetParam());
  std::mt19937 rng(10);
  std::vector<Feature> features = MakeFeatures(&rng);
  for (int64_t bad_id : {int64_t{-1}, int64_t{41}, int64_t{1} << 50}) {
    for (size_t f : {size_t{2}, size_t{7}}) {
      std::vector<Feature> copy = features;
      copy[f].ids[copy[f].ids.size() / 2] = bad_id;
      std::vector<PoolArgs> args = ArgsOf(&copy, 200);
      const std::vector<PoolTile> tiles =
          PlanPoolTiles(args.data(), args.size(), 0);
      int64_t bad_feature = -1;
      EXPECT_FALSE(RunPoolTiles(variant.pool, args.data(), tiles.data(), 0,
                                tiles.size(), &bad_feature));
      EXPECT_EQ(bad_feature, static_cast<int64_t>(f));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, RunPoolTilesTest,
                         ::testing::ValuesIn(AllVariants()),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(VariantAt(info.param).name);
                         });

}  // namespace
}  // namespace testing
}  // namespace tfce
