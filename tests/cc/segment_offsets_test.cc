// The TF-free segment ids -> CSR offsets core of FusedDecodeAxpy
// (kernels/core/segment_offsets.h), against a plain counting reference.
#include "kernels/core/segment_offsets.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tfce {
namespace {

using Problem = SegmentIdsCheck::Problem;

// offsets[s] = number of ids < s, for sorted in-range ids.
template <typename Seg>
std::vector<int64_t> ReferenceOffsets(const std::vector<Seg>& seg,
                                      int64_t num_segments) {
  std::vector<int64_t> offsets(num_segments + 1, 0);
  for (Seg s : seg) ++offsets[static_cast<int64_t>(s) + 1];
  for (int64_t s = 0; s < num_segments; ++s) offsets[s + 1] += offsets[s];
  return offsets;
}

template <typename Seg>
std::vector<int64_t> Offsets(const std::vector<Seg>& seg,
                             int64_t num_segments) {
  std::vector<int64_t> offsets(num_segments + 1, -7);
  const SegmentIdsCheck check =
      SegmentOffsets(seg.data(), static_cast<int64_t>(seg.size()), num_segments,
                     offsets.data());
  EXPECT_TRUE(check.ok());
  return offsets;
}

template <typename Seg>
SegmentIdsCheck Check(const std::vector<Seg>& seg, int64_t num_segments) {
  std::vector<int64_t> offsets(num_segments + 1 > 0 ? num_segments + 1 : 1);
  const SegmentIdsCheck with_offsets =
      SegmentOffsets(seg.data(), static_cast<int64_t>(seg.size()), num_segments,
                     offsets.data());
  const SegmentIdsCheck without =
      SegmentOffsets(seg.data(), static_cast<int64_t>(seg.size()), num_segments,
                     static_cast<int64_t*>(nullptr));
  EXPECT_EQ(with_offsets.problem, without.problem);
  EXPECT_EQ(with_offsets.position, without.position);
  return with_offsets;
}

template <typename T>
class SegmentOffsetsTest : public ::testing::Test {};
using SegmentTypes = ::testing::Types<int32_t, int64_t>;
TYPED_TEST_SUITE(SegmentOffsetsTest, SegmentTypes);

TYPED_TEST(SegmentOffsetsTest, NoIdsNoSegments) {
  EXPECT_EQ(Offsets<TypeParam>({}, 0), (std::vector<int64_t>{0}));
}

TYPED_TEST(SegmentOffsetsTest, NoIdsAllSegmentsEmpty) {
  EXPECT_EQ(Offsets<TypeParam>({}, 3), (std::vector<int64_t>{0, 0, 0, 0}));
}

TYPED_TEST(SegmentOffsetsTest, EmptySegmentsAtStartMiddleAndEnd) {
  EXPECT_EQ(Offsets<TypeParam>({1, 1, 3}, 5),
            (std::vector<int64_t>{0, 0, 2, 2, 3, 3}));
}

TYPED_TEST(SegmentOffsetsTest, DuplicatesFormOneSegment) {
  EXPECT_EQ(Offsets<TypeParam>({2, 2, 2, 2}, 3),
            (std::vector<int64_t>{0, 0, 0, 4}));
}

TYPED_TEST(SegmentOffsetsTest, OneIdPerSegment) {
  EXPECT_EQ(Offsets<TypeParam>({0, 1, 2}, 3),
            (std::vector<int64_t>{0, 1, 2, 3}));
}

TYPED_TEST(SegmentOffsetsTest, UnsortedRefusedAtTheFirstDescent) {
  const SegmentIdsCheck check = Check<TypeParam>({0, 2, 2, 1, 0}, 3);
  EXPECT_EQ(check.problem, Problem::kUnsorted);
  EXPECT_EQ(check.position, 3);
  EXPECT_EQ(check.value, 1);
  EXPECT_EQ(check.previous, 2);
}

TYPED_TEST(SegmentOffsetsTest, NegativeRefused) {
  const SegmentIdsCheck check = Check<TypeParam>({-1, 0}, 2);
  EXPECT_EQ(check.problem, Problem::kOutOfRange);
  EXPECT_EQ(check.position, 0);
  EXPECT_EQ(check.value, -1);
}

TYPED_TEST(SegmentOffsetsTest, TooLargeRefused) {
  const SegmentIdsCheck check = Check<TypeParam>({0, 1, 3}, 3);
  EXPECT_EQ(check.problem, Problem::kOutOfRange);
  EXPECT_EQ(check.position, 2);
  EXPECT_EQ(check.value, 3);
}

TYPED_TEST(SegmentOffsetsTest, OutOfRangeBeforeUnsortedIsReportedFirst) {
  const SegmentIdsCheck check = Check<TypeParam>({5, 1}, 3);
  EXPECT_EQ(check.problem, Problem::kOutOfRange);
  EXPECT_EQ(check.position, 0);
  EXPECT_EQ(check.value, 5);
}

TYPED_TEST(SegmentOffsetsTest, IdsWithZeroSegmentsRefused) {
  const SegmentIdsCheck check = Check<TypeParam>({0}, 0);
  EXPECT_EQ(check.problem, Problem::kOutOfRange);
  EXPECT_EQ(check.position, 0);
}

// The precise scan run on ids the fast check passed: they must have changed
// in between (a concurrent writer), which the op reports as internal.
TYPED_TEST(SegmentOffsetsTest, PreciseScanOfValidIdsSaysTheyChanged) {
  const std::vector<TypeParam> seg = {0, 0, 1};
  EXPECT_EQ(FirstBadSegmentId(seg.data(), 3, 2).problem,
            Problem::kChangedWhileRead);
}

TYPED_TEST(SegmentOffsetsTest, RandomSortedIdsMatchTheReference) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t num_segments =
        std::uniform_int_distribution<int64_t>(0, 40)(rng);
    const int64_t n = num_segments == 0
                          ? 0
                          : std::uniform_int_distribution<int64_t>(0, 200)(rng);
    std::vector<TypeParam> seg(n);
    if (trial % 3 == 0 && num_segments > 0) {
      // Bags of one length (a padded batch): the guessed next offset path.
      const int64_t len = 1 + trial % 5;
      for (int64_t i = 0; i < n; ++i) {
        seg[i] = static_cast<TypeParam>(std::min(i / len, num_segments - 1));
      }
    } else {
      std::uniform_int_distribution<int64_t> pick(0, num_segments - 1);
      for (auto& s : seg) s = static_cast<TypeParam>(pick(rng));
      std::sort(seg.begin(), seg.end());
    }
    EXPECT_EQ(Offsets(seg, num_segments), ReferenceOffsets(seg, num_segments))
        << "trial " << trial;
  }
}

TYPED_TEST(SegmentOffsetsTest, GallopFindsTheFirstPositionAtOrAbove) {
  const std::vector<TypeParam> seg = {0, 0, 1, 1, 1, 4, 4, 9};
  const int64_t n = static_cast<int64_t>(seg.size());
  for (int64_t lo = 0; lo <= n; ++lo) {
    for (int64_t s = -1; s <= 10; ++s) {
      int64_t want = lo;
      while (want < n && static_cast<int64_t>(seg[want]) < s) ++want;
      EXPECT_EQ(GallopLowerBound(seg.data(), lo, n, s), want)
          << "lo " << lo << " s " << s;
    }
  }
}

}  // namespace
}  // namespace tfce
