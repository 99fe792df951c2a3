// The prefetch policy (kernels/core/prefetch_policy.h) at its boundaries,
// and the TFCE_* tuning variables' parsing (kernels/core/tuning_env.h).
#include "kernels/core/prefetch_policy.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "kernels/core/cpu_features.h"
#include "kernels/core/kernel_api.h"
#include "kernels/core/tuning_env.h"
#include "tests/cc/kernel_test_util.h"

namespace tfce {
namespace testing {
namespace {

int64_t PoolPrefetch(Storage storage, int64_t rows, int64_t dim, double bag) {
  return PoolPrefetchRows(TableView{storage, nullptr, nullptr, rows, dim}, bag);
}

int64_t Distance(Storage storage, int64_t rows, int64_t dim) {
  return PrefetchDistance(TableView{storage, nullptr, nullptr, rows, dim});
}

// Run without TFCE_PREFETCH_ROWS: the default policy.
class PrefetchPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("TFCE_PREFETCH_ROWS") != nullptr) {
      GTEST_SKIP() << "TFCE_PREFETCH_ROWS is set: prefetch policy not tested";
    }
  }
};

TEST_F(PrefetchPolicyTest, L2CacheSizeRead) {
  EXPECT_GE(GetCpuFeatures().l2_cache_bytes, 64 * 1024);
}

// No prefetch only for long bags of rows under a cache line of a cached
// table. Bytes per row: int8 dim + a 4-byte scale (split), fp16 2 * dim,
// int8 records 4 + dim, int4 records 4 + ceil(dim / 2) (TestRowBytes).
TEST_F(PrefetchPolicyTest, NoPrefetchOnlyForLongBagsOfShortRowsInCache) {
  const int64_t cached =
      kCachedTableL2Multiple * GetCpuFeatures().l2_cache_bytes;
  const int64_t huge = int64_t{1} << 40;  // rows: far beyond any cache
  const double long_bag = kLongBagIds, short_bag = kLongBagIds - 0.01;
  struct Format {
    Storage storage;
    int64_t scale_bytes, largest_short_dim;  // rows under 64 bytes
  };
  for (const Format& f :
       {Format{Storage::kInt8Split, 4, 63}, Format{Storage::kFp16, 0, 31},
        Format{Storage::kInt8Rowwise, 0, 59},
        Format{Storage::kInt4Rowwise, 0, 118}}) {
    EXPECT_LT(TestRowBytes(f.storage, f.largest_short_dim), 64);
    EXPECT_GE(TestRowBytes(f.storage, f.largest_short_dim + 1), 64);
    for (int64_t dim : {int64_t{1}, int64_t{12}, f.largest_short_dim}) {
      SCOPED_TRACE(std::string(StorageName(f.storage)) + " dim " +
                   std::to_string(dim));
      const int64_t rows =
          cached / (TestRowBytes(f.storage, dim) + f.scale_bytes);
      EXPECT_EQ(PoolPrefetch(f.storage, rows, dim, long_bag), 0)
          << "cached: no prefetch";
      const int64_t distance = Distance(f.storage, rows, dim);
      EXPECT_EQ(PoolPrefetch(f.storage, rows + 1, dim, long_bag), distance)
          << "past the cache: prefetch";
      EXPECT_EQ(PoolPrefetch(f.storage, rows, dim, short_bag), distance)
          << "cached, short bags: prefetch";
      EXPECT_EQ(PoolPrefetch(f.storage, huge, dim, long_bag), distance)
          << "huge table: prefetch";
    }
    // A row of 64 bytes or more: prefetched, even cached.
    const int64_t long_dim = f.largest_short_dim + 1;
    EXPECT_EQ(PoolPrefetch(f.storage, 10, long_dim, long_bag),
              Distance(f.storage, 10, long_dim))
        << StorageName(f.storage);
  }
}

// Rows of a cache line or more are prefetched at any table size.
TEST_F(PrefetchPolicyTest, LongRowsAlwaysPrefetched) {
  EXPECT_EQ(PoolPrefetch(Storage::kInt8Split, 10, 64, 100), 53);
  EXPECT_EQ(PoolPrefetch(Storage::kFp16, 10, 32, 100), 80);
  EXPECT_EQ(PoolPrefetch(Storage::kInt8Rowwise, 10, 60, 100), 80);
  EXPECT_EQ(PoolPrefetch(Storage::kInt4Rowwise, 10, 120, 100), 80);
}

TEST_F(PrefetchPolicyTest, LookupUsesTheFixedDistance) {
  EXPECT_EQ(PrefetchRows(), kDefaultPrefetchRows);
}

// About kPrefetchLines lines in flight: 160 / (bytes / 64 + 1 [+ 1 for a
// split int8 row's scale]) rows, within [kMinPrefetchRows,
// kMaxPrefetchRows]; a record's inline scale costs no line of its own.
TEST_F(PrefetchPolicyTest, DistanceKeepsAboutKPrefetchLinesInFlight) {
  struct Case {
    Storage storage;
    int64_t dim, rows;
  };
  for (const Case& c :
       {Case{Storage::kInt8Split, 12, 73}, Case{Storage::kInt8Split, 128, 40},
        Case{Storage::kFp16, 12, 116}, Case{Storage::kFp16, 128, 32},
        Case{Storage::kFp16, 1, kMaxPrefetchRows},
        Case{Storage::kFp16, 4096, kMinPrefetchRows},
        // 132 and 204 bytes.
        Case{Storage::kInt8Rowwise, 128, 52},
        Case{Storage::kInt8Rowwise, 200, 38},
        Case{Storage::kInt8Rowwise, 12, kMaxPrefetchRows},
        // 68 bytes; 2004 bytes.
        Case{Storage::kInt4Rowwise, 128, 77},
        Case{Storage::kInt4Rowwise, 12, kMaxPrefetchRows},
        Case{Storage::kInt4Rowwise, 4000, kMinPrefetchRows}}) {
    EXPECT_EQ(Distance(c.storage, 1000, c.dim), c.rows)
        << StorageName(c.storage) << " dim " << c.dim;
  }
}

// Tuning variables: a number >= 0 clamped to max, else the fallback; never
// a failure.
TEST(TuningEnvTest, ParsesClampsAndFallsBack) {
  const char* kName = "TFCE_TEST_TUNING_VALUE";
  struct Case {
    const char* value;  // nullptr: unset
    double expected;
  };
  for (const Case& c :
       {Case{nullptr, -1}, Case{"", -1}, Case{"0", 0}, Case{"16", 16},
        Case{"2.5e3", 2500}, Case{"4096", 4096}, Case{"4097", 4096},
        Case{"inf", 4096}, Case{"-1", -1}, Case{"16x", -1}, Case{"abc", -1},
        Case{"nan", -1}, Case{" 8", 8}}) {
    if (c.value == nullptr) {
      unsetenv(kName);
    } else {
      setenv(kName, c.value, 1);
    }
    EXPECT_EQ(TuningEnv(kName, -1, 4096), c.expected)
        << "TuningEnv(\"" << (c.value ? c.value : "<unset>") << "\")";
  }
  unsetenv(kName);
}

// An infinite maximum lets "inf" through (TFCE_MIN_PARALLEL_COST=inf: the
// ops never split a call).
TEST(TuningEnvTest, InfiniteMaximumLetsInfThrough) {
  const char* kName = "TFCE_TEST_TUNING_VALUE";
  setenv(kName, "inf", 1);
  EXPECT_TRUE(std::isinf(TuningEnv(kName, -1, HUGE_VAL)));
  unsetenv(kName);
}

}  // namespace
}  // namespace testing
}  // namespace tfce
