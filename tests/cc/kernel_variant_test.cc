// Every kernel variant of the dispatch table against an independent
// double-precision reference, in one process: each test selects its variant
// with a ScopedVariantOverride and calls it through SelectedVariant(), the
// path the ops take. Variants this CPU cannot run are skipped (and say so).
//
//  - lookup: exact against the reference decode and bit-identical to the
//    scalar variant, over (variant x storage x dim x id width), with
//    sentinel-padded outputs (no write outside the rows asked for) and
//    unaligned table/output pointers; false on ids < 0 or >= rows;
//  - pool: within the float32 accumulation bound, over (variant x storage x
//    dim x id width x combiner x weighted); empty, single, long and
//    duplicate-id bags, weights that cancel to a zero denominator; false on
//    bad ids;
//  - every storage format: int8 with separate scales, fp16, and the rowwise
//    int8 (float32 scale inline) and int4 (float16 scale and bias inline,
//    two values a byte) records;
//  - every half value through each variant's lookup under DAZ/FTZ, as an
//    fp16 value and as an int4 record's scale and bias;
//  - exact IEEE half -> float decoding (the scalar reference's
//    HalfBitsToFloat, against the compiler's _Float16).
#include <xmmintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/dispatch.h"
#include "kernels/core/fp16.h"
#include "kernels/core/kernel_api.h"
#include "tests/cc/kernel_test_util.h"

namespace tfce {
namespace testing {
namespace {

// The reference variant, the specification (the last of the list).
const KernelVariant& ScalarVariant() {
  int n = 0;
  return KernelVariants(&n)[n - 1];
}

std::vector<int64_t> Dims() {
  std::vector<int64_t> dims;
  for (int64_t d = 1; d <= 33; ++d) dims.push_back(d);
  for (int64_t d : {64, 100, 128, 129, 257}) dims.push_back(d);
  return dims;
}

enum class IdWidth { k32, k64 };

std::string Name(int variant, Storage storage, int64_t dim, IdWidth width) {
  return std::string(VariantAt(variant).name) + "_" + StorageName(storage) +
         "_dim" + std::to_string(dim) +
         (width == IdWidth::k64 ? "_idx64" : "_idx32");
}

const char* CombinerName(Combiner c) {
  return c == Combiner::kSum ? "sum" : c == Combiner::kMean ? "mean" : "sqrtn";
}

TEST(KernelVariantsTest, LastIsTheScalarReference) {
  int n = 0;
  const KernelVariant* variants = KernelVariants(&n);
  ASSERT_GT(n, 0);
  EXPECT_STREQ(variants[n - 1].name, "scalar");
  EXPECT_TRUE(variants[n - 1].cpu_can_run());
}

TEST(HalfDecodingTest, AllHalfValuesExact) {
  int mismatches = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 half;
    const uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&half, &bits, 2);
    if (!SameFloat(HalfBitsToFloat(bits), static_cast<float>(half))) {
      ++mismatches;
    }
  }
  EXPECT_EQ(mismatches, 0) << "HalfBitsToFloat on all 65536 half values";
}

// ------------------------------------------------------------- lookup

using LookupParam = std::tuple<int, Storage, int64_t, IdWidth>;

class LookupTest : public ::testing::TestWithParam<LookupParam> {
 protected:
  template <typename Index>
  void Run(const KernelVariant& variant, const Table& t, std::mt19937* rng);
};

template <typename Index>
void LookupTest::Run(const KernelVariant& variant, const Table& t,
                     std::mt19937* rng) {
  const int64_t n = 23;
  std::vector<Index> ids(n);
  std::uniform_int_distribution<int64_t> pick(0, t.rows - 1);
  for (auto& id : ids) id = static_cast<Index>(pick(*rng));
  ids[0] = static_cast<Index>(t.rows - 1);
  Padded out(n * t.dim);
  // Decode positions [3, n): rows 0..2 must keep their sentinels.
  LookupArgs args{t.View(),  IdsView{ids.data(), sizeof(Index) == 8},
                  3,         n,
                  out.out(), /*prefetch_rows=*/4};
  ASSERT_TRUE(variant.lookup(args)) << "returned false on valid ids";
  Padded scalar_out(n * t.dim);
  LookupArgs scalar_args = args;
  scalar_args.out = scalar_out.out();
  ASSERT_TRUE(ScalarVariant().lookup(scalar_args));
  bool exact = true, same_as_scalar = true, untouched = true;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t d = 0; d < t.dim; ++d) {
      const float got = out.out()[i * t.dim + d];
      same_as_scalar &= SameFloat(got, scalar_out.out()[i * t.dim + d]);
      if (i < 3) {
        untouched &= got == kSentinel;
      } else {
        exact &=
            SameFloat(got, static_cast<float>(t.decoded[ids[i] * t.dim + d]));
      }
    }
  }
  EXPECT_TRUE(exact) << "differs from the reference decode";
  EXPECT_TRUE(same_as_scalar) << "not bit-identical to the scalar variant";
  EXPECT_TRUE(untouched && out.PadsIntact()) << "wrote outside its rows";
  for (int64_t bad : {int64_t{-1}, t.rows}) {
    ids[5] = static_cast<Index>(bad);
    EXPECT_FALSE(variant.lookup(args)) << "accepted id " << bad;
  }
}

TEST_P(LookupTest, ExactAndRefusesBadIds) {
  const auto [index, storage, dim, width] = GetParam();
  TFCE_SELECT_VARIANT_OR_SKIP(index);
  std::mt19937 rng(1234 + static_cast<int>(dim));
  const Table t = MakeTable(storage, 31, dim, &rng);
  if (width == IdWidth::k64) {
    Run<int64_t>(variant, t, &rng);
  } else {
    Run<int32_t>(variant, t, &rng);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, LookupTest,
    ::testing::Combine(::testing::ValuesIn(AllVariants()),
                       ::testing::ValuesIn(AllStorages()),
                       ::testing::ValuesIn(Dims()),
                       ::testing::Values(IdWidth::k32, IdWidth::k64)),
    [](const ::testing::TestParamInfo<LookupParam>& info) {
      return Name(std::get<0>(info.param), std::get<1>(info.param),
                  std::get<2>(info.param), std::get<3>(info.param));
    });

// ------------------------------------------------------------- pool

using PoolParam = std::tuple<int, Storage, int64_t, IdWidth, Combiner, bool>;

class PoolTest : public ::testing::TestWithParam<PoolParam> {
 protected:
  template <typename Index>
  void Run(const KernelVariant& variant, const Table& t, Combiner combiner,
           bool weighted, std::mt19937* rng);
};

template <typename Index>
void PoolTest::Run(const KernelVariant& variant, const Table& t,
                   Combiner combiner, bool weighted, std::mt19937* rng) {
  // Bags: 0 empty, 1 long, 2 single, 3 duplicates, 4 empty, 5 mixed,
  // 6 weights that cancel (a zero sum for mean; sum and sqrtn pool rows
  // whose weighted biases, for int4, cancel too).
  const std::vector<int64_t> sizes = {0, 70, 1, 6, 0, 9, 4};
  std::vector<int64_t> offsets = {0};
  for (int64_t s : sizes) offsets.push_back(offsets.back() + s);
  const int64_t n = offsets.back(), bags = sizes.size();
  std::vector<Index> ids(n);
  std::vector<float> weights(n);
  std::uniform_int_distribution<int64_t> pick(0, t.rows - 1);
  std::uniform_real_distribution<float> w(0.5f, 1.5f);
  for (int64_t i = 0; i < n; ++i) {
    ids[i] =
        static_cast<Index>(i >= offsets[3] && i < offsets[4] ? 4 : pick(*rng));
    weights[i] = w(*rng);
  }
  ids[offsets[1]] = static_cast<Index>(t.rows - 1);
  const float cancelling[] = {1.5f, -1.5f, 0.25f, -0.25f};
  for (int64_t k = 0; k < 4; ++k) weights[offsets[6] + k] = cancelling[k];
  // Bag rows kGap floats apart: the output is a column block of a wider
  // matrix, as in the batched op's concatenated output.
  constexpr int64_t kGap = 3;
  const int64_t stride = t.dim + kGap;
  Padded out(bags * stride);
  PoolArgs args{t.View(),
                IdsView{ids.data(), sizeof(Index) == 8},
                weighted ? weights.data() : nullptr,
                offsets.data(),
                combiner,
                1,
                bags,
                out.out(),  // bag 0 is left to other threads
                stride,
                /*prefetch_rows=*/3};
  ASSERT_TRUE(variant.pool(args)) << "returned false on valid ids";
  bool close = true, untouched = true;
  for (int64_t d = 0; d < t.dim; ++d) untouched &= out.out()[d] == kSentinel;
  for (int64_t b = 0; b < bags; ++b) {
    for (int64_t d = t.dim; d < stride; ++d) {
      untouched &= out.out()[b * stride + d] == kSentinel;
    }
  }
  for (int64_t b = 1; b < bags; ++b) {
    for (int64_t d = 0; d < t.dim; ++d) {
      double sum = 0, mag = 0, wsum = 0, w2sum = 0;
      for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) {
        const double wi = weighted ? weights[i] : 1.0;
        const double term = wi * t.decoded[ids[i] * t.dim + d];
        sum += term;
        mag += std::fabs(wi) * t.magnitude[ids[i] * t.dim + d];
        wsum += wi;
        w2sum += wi * wi;
      }
      double denom = 1;
      if (combiner == Combiner::kMean) denom = wsum;
      if (combiner == Combiner::kSqrtN) denom = std::sqrt(w2sum);
      const double want = denom == 0 ? 0 : sum / denom;
      close &= std::fabs(out.out()[b * stride + d] - want) <=
               PooledFloat32ErrorBound(sizes[b], mag, denom);
    }
  }
  EXPECT_TRUE(close) << "beyond the float32 accumulation bound";
  EXPECT_TRUE(untouched && out.PadsIntact())
      << "wrote outside its bags' columns";
  for (int64_t bad : {int64_t{-1}, t.rows}) {
    ids[offsets[5] + 2] = static_cast<Index>(bad);
    EXPECT_FALSE(variant.pool(args)) << "accepted id " << bad;
  }
}

TEST_P(PoolTest, WithinBoundAndRefusesBadIds) {
  const auto [index, storage, dim, width, combiner, weighted] = GetParam();
  TFCE_SELECT_VARIANT_OR_SKIP(index);
  std::mt19937 rng(1234 + static_cast<int>(dim));
  const Table t = MakeTable(storage, 31, dim, &rng);
  if (width == IdWidth::k64) {
    Run<int64_t>(variant, t, combiner, weighted, &rng);
  } else {
    Run<int32_t>(variant, t, combiner, weighted, &rng);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, PoolTest,
    ::testing::Combine(::testing::ValuesIn(AllVariants()),
                       ::testing::ValuesIn(AllStorages()),
                       ::testing::ValuesIn(Dims()),
                       ::testing::Values(IdWidth::k32, IdWidth::k64),
                       ::testing::Values(Combiner::kSum, Combiner::kMean,
                                         Combiner::kSqrtN),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<PoolParam>& info) {
      return Name(std::get<0>(info.param), std::get<1>(info.param),
                  std::get<2>(info.param), std::get<3>(info.param)) +
             "_" + CombinerName(std::get<4>(info.param)) +
             (std::get<5>(info.param) ? "_weighted" : "");
    });

// ------------------------------------------------------------- DAZ/FTZ

class HalvesUnderDazTest : public ::testing::TestWithParam<int> {};

// Every half value through the variant's lookup, with the denormals-are-zero
// and flush-to-zero modes TensorFlow's threads run with: subnormal halves
// must still decode exactly.
TEST_P(HalvesUnderDazTest, AllHalfValuesExact) {
  TFCE_SELECT_VARIANT_OR_SKIP(GetParam());
  std::vector<uint16_t> table(65536);
  for (uint32_t h = 0; h < 65536; ++h) table[h] = static_cast<uint16_t>(h);
  const int64_t id = 0;
  std::vector<float> out(65536);
  LookupArgs args{TableView{Storage::kFp16, table.data(), nullptr, 1, 65536},
                  IdsView{&id, true},
                  0,
                  1,
                  out.data(),
                  0};
  const unsigned int saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);  // DAZ | FTZ
  const bool ok = variant.lookup(args);
  _mm_setcsr(saved);
  int mismatches = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    if (!SameFloat(out[h], HalfBitsToFloat(static_cast<uint16_t>(h)))) {
      ++mismatches;
    }
  }
  EXPECT_TRUE(ok);
  EXPECT_EQ(mismatches, 0) << "all 65536 halves under DAZ/FTZ";
}

// Every half value as an int4 record's scale and bias (each ISA reads the
// pair with its own conversion), under DAZ/FTZ: row h is [h][h][q = 1, 0],
// decoded 1 * h + h and 0 * h + h in float32, multiply then add. No float32
// subnormal can occur (halves widen to normal floats, and q h + h is 0 or
// at least 2^-24 in magnitude), so the modes must change nothing.
TEST_P(HalvesUnderDazTest, AllHalfValuesAsInt4ScaleAndBias) {
  TFCE_SELECT_VARIANT_OR_SKIP(GetParam());
  constexpr int64_t kRows = 65536, kDim = 2, kRecord = 4 + 1;
  std::vector<uint8_t> table(kRows * kRecord);
  std::vector<int64_t> ids(kRows);
  for (int64_t h = 0; h < kRows; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&table[h * kRecord], &bits, 2);      // scale
    std::memcpy(&table[h * kRecord + 2], &bits, 2);  // bias
    table[h * kRecord + 4] = 0x01;                   // q = 1, then 0
    ids[h] = h;
  }
  std::vector<float> out(kRows * kDim);
  LookupArgs args{
      TableView{Storage::kInt4Rowwise, table.data(), nullptr, kRows, kDim},
      IdsView{ids.data(), true},
      0,
      kRows,
      out.data(),
      0};
  const unsigned int saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);  // DAZ | FTZ
  const bool ok = variant.lookup(args);
  _mm_setcsr(saved);
  int mismatches = 0;
  for (int64_t h = 0; h < kRows; ++h) {
    _Float16 half;
    const uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&half, &bits, 2);
    const float s = static_cast<float>(half);  // the compiler's conversion
    if (!SameFloat(out[2 * h], s * 1.0f + s) ||
        !SameFloat(out[2 * h + 1], s * 0.0f + s)) {
      ++mismatches;
    }
  }
  EXPECT_TRUE(ok);
  EXPECT_EQ(mismatches, 0) << "all 65536 halves as scale and bias";
}

INSTANTIATE_TEST_SUITE_P(Variants, HalvesUnderDazTest,
                         ::testing::ValuesIn(AllVariants()),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(VariantAt(info.param).name);
                         });

}  // namespace
}  // namespace testing
}  // namespace tfce
