// Sorted segment ids -> CSR offsets, TF-free (std only): the algorithm
// behind FusedDecodeAxpy's segments, tested on its own by
// tests/cc/segment_offsets_test.cc. The op (kernels/tf/) turns a
// SegmentIdsCheck into its InvalidArgument message.
#ifndef TFCE_KERNELS_CORE_SEGMENT_OFFSETS_H_
#define TFCE_KERNELS_CORE_SEGMENT_OFFSETS_H_

#include <algorithm>
#include <cstdint>

namespace tfce {

// What is wrong with a list of segment ids, at the first bad position.
struct SegmentIdsCheck {
  enum class Problem {
    kNone,
    kOutOfRange,        // seg[position] = value is not in [0, num_segments)
    kUnsorted,          // seg[position - 1] = previous > seg[position] = value
    kChangedWhileRead,  // the fast check failed, the precise one did not
  };
  Problem problem = Problem::kNone;
  int64_t position = 0;
  int64_t value = 0;
  int64_t previous = 0;

  bool ok() const { return problem == Problem::kNone; }
};

// One unsigned compare covers both s < 0 and s >= limit.
inline bool InSegmentRange(int64_t s, int64_t limit) {
  return static_cast<uint64_t>(s) < static_cast<uint64_t>(limit);
}

// The first position of seg[0, n) that is out of range or out of order:
// the precise report for ids that failed the fast check in SegmentOffsets.
template <typename Seg>
SegmentIdsCheck FirstBadSegmentId(const Seg* seg, int64_t n,
                                  int64_t num_segments) {
  SegmentIdsCheck check;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = static_cast<int64_t>(seg[i]);
    check.position = i;
    check.value = s;
    if (!InSegmentRange(s, num_segments)) {
      check.problem = SegmentIdsCheck::Problem::kOutOfRange;
      return check;
    }
    if (i > 0 && s < static_cast<int64_t>(seg[i - 1])) {
      check.problem = SegmentIdsCheck::Problem::kUnsorted;
      check.previous = static_cast<int64_t>(seg[i - 1]);
      return check;
    }
  }
  check.problem = SegmentIdsCheck::Problem::kChangedWhileRead;
  return check;
}

// The first position in [lo, n) whose segment id is >= s (n if none), for
// sorted ids: an exponential search from lo, so walking the segments in
// order costs O(log gap) per segment, O(1) for the common short bags. On
// unsorted input it still returns a position in [lo, n].
template <typename Seg>
int64_t GallopLowerBound(const Seg* seg, int64_t lo, int64_t n, int64_t s) {
  int64_t hi = lo;  // positions before lo hold ids < s
  int64_t step = 1;
  while (hi < n && static_cast<int64_t>(seg[hi]) < s) {
    lo = hi + 1;
    hi = lo + step;
    step *= 2;
  }
  if (hi > n) hi = n;
  return std::lower_bound(
             seg + lo, seg + hi, s,
             [](Seg a, int64_t b) { return static_cast<int64_t>(a) < b; }) -
         seg;
}

// Checks that seg[0, n) is sorted and in [0, num_segments) and, unless
// offsets is null, converts it to CSR offsets: segment s is positions
// [offsets[s], offsets[s + 1]). The check is one branch-free pass that the
// compiler vectorizes (sorted ids are in range when the first and the last
// are); the offsets are then found by checking that the next segment is as
// long as the last one, else by searching, not by another pass. Every
// offset is a position in [0, n] written to offsets[0..num_segments] whatever
// the ids hold, so a concurrent change of the input cannot push a write or a
// later read out of bounds.
template <typename Seg>
SegmentIdsCheck SegmentOffsets(const Seg* seg, int64_t n, int64_t num_segments,
                               int64_t* offsets) {
  if (n > 0) {
    int unsorted = 0;  // int, not bool: GCC vectorizes only this form
    for (int64_t i = 1; i < n; ++i) unsorted |= seg[i] < seg[i - 1];
    if (unsorted ||
        !InSegmentRange(static_cast<int64_t>(seg[0]), num_segments) ||
        !InSegmentRange(static_cast<int64_t>(seg[n - 1]), num_segments)) {
      return FirstBadSegmentId(seg, n, num_segments);
    }
  }
  if (offsets != nullptr) {
    int64_t pos = GallopLowerBound(seg, 0, n, 0);
    int64_t len = 0;  // the last segment's length: the usual next one
    offsets[0] = pos;
    for (int64_t s = 0; s + 1 < num_segments; ++s) {
      // Segment s is [pos, next): next is the first position past pos whose
      // id is > s. Bags of one length (a padded batch) guess it right.
      const int64_t guess = pos + len;
      int64_t next;
      if (guess <= n && (guess == n || static_cast<int64_t>(seg[guess]) > s) &&
          (guess == pos || static_cast<int64_t>(seg[guess - 1]) <= s)) {
        next = guess;
      } else {
        next = GallopLowerBound(seg, pos, n, s + 1);
      }
      len = next - pos;
      offsets[s + 1] = pos = next;
    }
    offsets[num_segments] = n;
  }
  return SegmentIdsCheck();
}

}  // namespace tfce

#endif  // TFCE_KERNELS_CORE_SEGMENT_OFFSETS_H_
