// The storage formats as the SIMD kernels see them: one `Rows` type per
// format, over an ISA's vector traits (the traits' contract is at the top of
// simd_kernels_inl.h, the only file that includes this one, after defining
// TFCE_ALWAYS_INLINE). A Rows type gives a row's values and record
// (Values, Record), its decode factors (Meta: scale, and bias when
// kHasBias), how to load kLanes values from element `first` on (Load, and
// LoadTail for fewer) and, when kPairedLoads, two vectors at once with their
// even and odd elements apart (LoadPair). Like simd_kernels_inl.h, everything
// is in an anonymous namespace: it is compiled once per ISA file.
#ifndef TFCE_KERNELS_CORE_SIMD_ROWS_INL_H_
#define TFCE_KERNELS_CORE_SIMD_ROWS_INL_H_

#include <cstdint>

#include "kernels/core/kernel_api.h"

#ifndef TFCE_ALWAYS_INLINE
#error "include kernels/core/simd_kernels_inl.h, not this file"
#endif

namespace tfce {
namespace {

// A row's decode factors: value * scale + bias (bias used when kHasBias).
struct RowMeta {
  float scale;
  float bias;
};

// The storage formats, as seen by the kernels: where a row's record starts
// and how long it is, how to load its values, and its scale and bias.
// Load(values, first) loads the kLanes values from element `first` on
// (always a multiple of kLanes, so even).
template <class Isa>
struct Int8SplitRows {
  using Elem = int8_t;
  using Vec = typename Isa::Vec;
  static constexpr bool kHasBias = false;
  static constexpr bool kPairedLoads = false;
  static constexpr Storage kStorage = Storage::kInt8Split;
  static const Elem* Values(const TableView& t, int64_t id) {
    return static_cast<const Elem*>(t.data) + id * t.dim;
  }
  static RowMeta Meta(const TableView& t, int64_t id) {
    return {t.scales[id], 0.0f};
  }
  // The scale lives in its own array: a second cache line to fetch. Always
  // inlined, like every function that only prefetches (see PrefetchRow).
  TFCE_ALWAYS_INLINE static void PrefetchScale(const TableView& t, int64_t id) {
    Isa::Prefetch(t.scales + id);
  }
  static Vec Load(const Elem* p, int64_t first) {
    return Isa::LoadInt8(p + first);
  }
  static Vec LoadTail(const Elem* p, int64_t first, int n) {
    return Isa::LoadInt8Tail(p + first, n);
  }
};

template <class Isa>
struct HalfRows {
  using Elem = uint16_t;
  using Vec = typename Isa::Vec;
  static constexpr bool kHasBias = false;
  static constexpr bool kPairedLoads = false;
  static constexpr Storage kStorage = Storage::kFp16;
  static const Elem* Values(const TableView& t, int64_t id) {
    return static_cast<const Elem*>(t.data) + id * t.dim;
  }
  static RowMeta Meta(const TableView&, int64_t) { return {1.0f, 0.0f}; }
  TFCE_ALWAYS_INLINE static void PrefetchScale(const TableView&, int64_t) {}
  static Vec Load(const Elem* p, int64_t first) {
    return Isa::LoadHalf(p + first);
  }
  static Vec LoadTail(const Elem* p, int64_t first, int n) {
    return Isa::LoadHalfTail(p + first, n);
  }
};

// The start of row `id`'s record in a rowwise table.
template <Storage kStorage>
const unsigned char* Record(const TableView& t, int64_t id) {
  return static_cast<const unsigned char*>(t.data) +
         id * RecordBytes(kStorage, t.dim);
}

// One cache line per row (mostly): the float32 scale leads the record.
template <class Isa>
struct Int8RowwiseRows {
  using Elem = int8_t;
  using Vec = typename Isa::Vec;
  static constexpr bool kHasBias = false;
  static constexpr bool kPairedLoads = false;
  static constexpr Storage kStorage = Storage::kInt8Rowwise;
  static const Elem* Values(const TableView& t, int64_t id) {
    return reinterpret_cast<const Elem*>(Record<kStorage>(t, id) +
                                         kRecordHeaderBytes);
  }
  static RowMeta Meta(const TableView& t, int64_t id) {
    float scale;
    __builtin_memcpy(&scale, Record<kStorage>(t, id), 4);
    return {scale, 0.0f};
  }
  TFCE_ALWAYS_INLINE static void PrefetchScale(const TableView&, int64_t) {}
  static Vec Load(const Elem* p, int64_t first) {
    return Isa::LoadInt8(p + first);
  }
  static Vec LoadTail(const Elem* p, int64_t first, int n) {
    return Isa::LoadInt8Tail(p + first, n);
  }
};

// Two values per byte after a float16 scale and bias.
template <class Isa>
struct Int4RowwiseRows {
  using Elem = uint8_t;
  using Vec = typename Isa::Vec;
  static constexpr bool kHasBias = true;
  // Pooling loads two vectors at once, de-interleaved (LoadPair).
  static constexpr bool kPairedLoads = true;
  static constexpr Storage kStorage = Storage::kInt4Rowwise;
  static const Elem* Values(const TableView& t, int64_t id) {
    return Record<kStorage>(t, id) + kRecordHeaderBytes;
  }
  static RowMeta Meta(const TableView& t, int64_t id) {
    RowMeta meta;
    Isa::HalfPair(Record<kStorage>(t, id), &meta.scale, &meta.bias);
    return meta;
  }
  TFCE_ALWAYS_INLINE static void PrefetchScale(const TableView&, int64_t) {}
  static Vec Load(const Elem* p, int64_t first) {
    return Isa::LoadNibbles(p + first / 2);
  }
  static Vec LoadTail(const Elem* p, int64_t first, int n) {
    return Isa::LoadNibblesTail(p + first / 2, n);
  }
  // The 2 * kLanes values from element `first` on: even and odd elements.
  static void LoadPair(const Elem* p, int64_t first, Vec* even, Vec* odd) {
    Isa::LoadNibbleHalves(p + first / 2, even, odd);
  }
};

}  // namespace
}  // namespace tfce

#endif  // TFCE_KERNELS_CORE_SIMD_ROWS_INL_H_
