// The SIMD kernels, written once over an ISA's vector traits.
//
// Each ISA file (kernel_sse.cc, kernel_avx2.cc, kernel_avx512.cc) defines a
// traits struct `Isa` in an anonymous namespace, compiled with that file's
// ISA flags, and then includes this header, which instantiates the kernels
// for it. Everything here is in an anonymous namespace and depends on no
// inline function shared with other files: code compiled with -mavx2 must
// never be picked by the linker for a caller on a CPU without AVX2.
//
// The traits provide, for a vector of Isa::kLanes floats:
//   Vec Zero(), Set1(float), MulAdd(a, b, c) = a * b + c, Add, Mul, Div
//   Vec LoadInt8(const int8_t*), LoadHalf(const uint16_t*)   kLanes elements
//   Vec LoadNibbles(const uint8_t*)    kLanes unsigned 4-bit values from
//                                      kLanes / 2 bytes, low nibble first
//   void LoadNibbleHalves(const uint8_t* p, Vec* even, Vec* odd)
//                                      the 2 * kLanes values of kLanes bytes,
//                                      de-interleaved: even[j] = the low
//                                      nibble of byte j (element 2j), odd[j]
//                                      its high nibble (element 2j + 1)
//   void Interleave(Vec even, Vec odd, Vec* first, Vec* second)
//                                      back to element order: first = even[0],
//                                      odd[0], even[1], ..., second the rest
//   void Store(float*, Vec)
//   Vec LoadInt8Tail(p, n), LoadHalfTail(p, n), LoadNibblesTail(p, n),
//   StoreTail(p, v, n)
//     for 0 < n < kLanes: touch only n elements (nibbles: (n + 1) / 2
//     bytes; no read or write past them; a narrower exact vector path first,
//     then masks or staging).
//   void HalfPair(const void* p, float* first, float* second)   the two
//     float16 values at p, exactly widened
//   void Prefetch(const void*)
//
// Techniques (benchmarks/ladder.py measures what each one buys, step by
// step; history in CHANGELOG.md):
//  - contiguous loads of the stored row, widened in registers;
//  - decode fused with the weighted accumulation (one FMA per vector: the
//    row's scale is folded into the weight), accumulators in registers for
//    the whole bag, the decoded row never stored;
//  - the dimension split chosen once per call: fixed dims (8, 12, 16, 32,
//    64, 128) fully unrolled at compile time, others as blocks of
//    kMaxBlockVecs vectors plus one remainder block, all from one template;
//  - two independent accumulator sets over alternate ids when a block is
//    short, so consecutive FMAs do not wait on each other;
//  - int4 rows widened a vector pair at a time with their even and odd
//    elements in separate accumulators (a mask and a shift split the
//    nibbles, no byte shuffle per row); the pair is put back in element
//    order once per bag, when the block is stored;
//  - software prefetch of the rows `prefetch_rows` ids ahead.
#ifndef TFCE_KERNELS_CORE_SIMD_KERNELS_INL_H_
#define TFCE_KERNELS_CORE_SIMD_KERNELS_INL_H_

#include <cstdint>

#include "kernels/core/kernel_api.h"

#define TFCE_ALWAYS_INLINE inline __attribute__((always_inline))

// The storage formats as the kernels see them (the Rows types).
#include "kernels/core/simd_rows_inl.h"

namespace tfce {
namespace {

inline bool InRange(int64_t id, int64_t rows) {
  return static_cast<uint64_t>(id) < static_cast<uint64_t>(rows);
}

// Always inlined, as each ISA's Prefetch: a prefetch has no effect GCC can
// see, so an out-of-line function holding one is found side-effect free and
// every call to it is deleted. tests/kernels/test_isa_isolation.py checks the
// machine code.
template <class Isa, class Rows>
TFCE_ALWAYS_INLINE void PrefetchRow(const TableView& t, int64_t id) {
  const int64_t bytes = RecordBytes(Rows::kStorage, t.dim);
  const char* p = static_cast<const char*>(t.data) + id * bytes;
  Rows::PrefetchScale(t, id);
  if (bytes == 0) return;
  for (int64_t off = 0; off < bytes; off += 64) Isa::Prefetch(p + off);
  Isa::Prefetch(p + bytes - 1);  // a row may straddle one more line
}

// The first `distance` rows of a run of ids [begin, end), which the loop's
// prefetches (each `distance` ids ahead of its row) never cover: issued all
// at once, their misses overlap instead of stalling the loop one by one (on a
// table in DRAM each unprefetched row is a full miss of its own).
template <class Isa, class Rows, class Index>
TFCE_ALWAYS_INLINE void PrefetchFirstRows(const TableView& t, const Index* ids,
                                          int64_t begin, int64_t end,
                                          int64_t distance) {
  const int64_t stop = end - begin > distance ? begin + distance : end;
  for (int64_t i = begin; i < stop; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    if (InRange(id, t.rows)) PrefetchRow<Isa, Rows>(t, id);
  }
}

// ---------------------------------------------------------------- lookup

template <class Isa, class Rows, class Index>
bool LookupIds(const LookupArgs& a) {
  constexpr int W = Isa::kLanes;
  const Index* ids = static_cast<const Index*>(a.ids.data);
  const int64_t dim = a.table.dim;
  const int64_t full = dim / W * W;
  const int tail = static_cast<int>(dim - full);
  const int64_t distance = a.prefetch_rows;
  PrefetchFirstRows<Isa, Rows>(a.table, ids, a.begin, a.end, distance);
  for (int64_t i = a.begin; i < a.end; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    if (!InRange(id, a.table.rows)) return false;
    if (distance > 0 && i + distance < a.end) {
      const int64_t ahead = static_cast<int64_t>(ids[i + distance]);
      if (InRange(ahead, a.table.rows)) PrefetchRow<Isa, Rows>(a.table, ahead);
    }
    const typename Rows::Elem* row = Rows::Values(a.table, id);
    const RowMeta meta = Rows::Meta(a.table, id);
    const typename Isa::Vec scale = Isa::Set1(meta.scale);
    const typename Isa::Vec bias = Isa::Set1(meta.bias);
    float* out = a.out + i * dim;
    // A multiply, then an add, per element, exactly as the reference:
    // bit-identical.
    for (int64_t d = 0; d < full; d += W) {
      typename Isa::Vec v = Isa::Mul(Rows::Load(row, d), scale);
      if (Rows::kHasBias) v = Isa::Add(v, bias);
      Isa::Store(out + d, v);
    }
    if (tail) {
      typename Isa::Vec v = Isa::Mul(Rows::LoadTail(row, full, tail), scale);
      if (Rows::kHasBias) v = Isa::Add(v, bias);
      Isa::StoreTail(out + full, v, tail);
    }
  }
  return true;
}

// ---------------------------------------------------------------- pool

// Everything one bag needs, decided before its blocks run.
struct BagState {
  int64_t begin, end;    // ids of the bag
  int64_t prefetch_end;  // ids at or past this are not prefetched
  bool zero;             // zero denominator: the bag's output is zeros
  float denom;           // 1 for sum
};

// Tail length of a block: fixed at compile time (kTail >= 0, so masks and
// narrower loads fold to constants) or given at run time (kRuntimeTail).
constexpr int kRuntimeTail = -1;

// acc[0..kVecs) += factor * row[d0..d0+kVecs*W), and the tail into
// acc[kVecs]. Always inlined with fully unrolled loops, so `acc` lives in
// registers.
template <class Isa, class Rows, int kVecs, int kTail>
TFCE_ALWAYS_INLINE void AccumulateRowBlock(typename Isa::Vec* acc,
                                           const typename Rows::Elem* row,
                                           int64_t d0, typename Isa::Vec factor,
                                           int tail) {
  constexpr int W = Isa::kLanes;
  if constexpr (Rows::kPairedLoads) {
    // acc[2p] and acc[2p + 1] hold the even and odd elements of vector
    // pair p (PoolBlock interleaves them); an odd last vector is in order.
#pragma GCC unroll 8
    for (int k = 0; k + 1 < kVecs; k += 2) {
      typename Isa::Vec even, odd;
      Rows::LoadPair(row, d0 + k * W, &even, &odd);
      acc[k] = Isa::MulAdd(even, factor, acc[k]);
      acc[k + 1] = Isa::MulAdd(odd, factor, acc[k + 1]);
    }
    if (kVecs % 2 != 0) {
      acc[kVecs - 1] = Isa::MulAdd(Rows::Load(row, d0 + (kVecs - 1) * W),
                                   factor, acc[kVecs - 1]);
    }
  } else {
#pragma GCC unroll 16
    for (int k = 0; k < kVecs; ++k) {
      acc[k] = Isa::MulAdd(Rows::Load(row, d0 + k * W), factor, acc[k]);
    }
  }
  if (kTail != 0) {
    acc[kVecs] = Isa::MulAdd(Rows::LoadTail(row, d0 + kVecs * W, tail), factor,
                             acc[kVecs]);
  }
}

// One id of a bag: check it, prefetch ahead, accumulate its row (and its
// weighted bias into *bias_sum).
template <class Isa, class Rows, class Index, int kVecs, int kTail>
TFCE_ALWAYS_INLINE bool AccumulateId(const PoolArgs& a, const Index* ids,
                                     const BagState& bag, int64_t i, int64_t d0,
                                     int tail, int64_t distance,
                                     typename Isa::Vec* acc, float* bias_sum) {
  const TableView& t = a.table;
  const int64_t id = static_cast<int64_t>(ids[i]);
  if (!InRange(id, t.rows)) return false;
  if (distance > 0 && i + distance < bag.prefetch_end) {
    const int64_t ahead = static_cast<int64_t>(ids[i + distance]);
    if (InRange(ahead, t.rows)) PrefetchRow<Isa, Rows>(t, ahead);
  }
  const float w = a.weights ? a.weights[i] : 1.0f;
  const RowMeta meta = Rows::Meta(t, id);
  const typename Isa::Vec factor = Isa::Set1(w * meta.scale);
  if (Rows::kHasBias) *bias_sum = *bias_sum + w * meta.bias;
  AccumulateRowBlock<Isa, Rows, kVecs, kTail>(acc, Rows::Values(t, id), d0,
                                              factor, tail);
  return true;
}

// Accumulates one block of a bag's output: kVecs full vectors starting at
// element d0, plus a tail (< kLanes elements) after them when kTail != 0.
// Inlined into FixedDimBlocks, where d0 is then a constant (row addresses
// need no extra registers, which long fixed dims are short of); the
// runtime-dim path calls it through PoolBlockOutOfLine.
template <class Isa, class Rows, class Index, int kVecs, int kTail>
TFCE_ALWAYS_INLINE bool PoolBlock(const PoolArgs& a, const Index* ids,
                                  const BagState& bag, int64_t d0,
                                  int runtime_tail, bool prefetch, float* out) {
  using Vec = typename Isa::Vec;
  constexpr int W = Isa::kLanes;
  constexpr int kAcc = kVecs + (kTail != 0 ? 1 : 0);
  constexpr int kSize = kAcc > 0 ? kAcc : 1;
  const int tail = kTail >= 0 ? kTail : runtime_tail;
  // Short blocks get a second accumulator set (odd ids): consecutive FMAs
  // then do not wait on each other.
  constexpr bool kTwoSets = kAcc <= 2;
  Vec acc0[kSize], acc1[kSize];
#pragma GCC unroll 16
  for (int k = 0; k < kSize; ++k) acc0[k] = acc1[k] = Isa::Zero();
  float bias_sum0 = 0.0f, bias_sum1 = 0.0f;
  const int64_t distance = prefetch ? a.prefetch_rows : 0;
  int64_t i = bag.begin;
  if (kTwoSets) {
    for (; i + 2 <= bag.end; i += 2) {
      if (!AccumulateId<Isa, Rows, Index, kVecs, kTail>(
              a, ids, bag, i, d0, tail, distance, acc0, &bias_sum0) ||
          !AccumulateId<Isa, Rows, Index, kVecs, kTail>(
              a, ids, bag, i + 1, d0, tail, distance, acc1, &bias_sum1)) {
        return false;
      }
    }
  }
  for (; i < bag.end; ++i) {
    if (!AccumulateId<Isa, Rows, Index, kVecs, kTail>(
            a, ids, bag, i, d0, tail, distance, acc0, &bias_sum0)) {
      return false;
    }
  }
  const Vec denom = Isa::Set1(bag.denom);
  const Vec bias_sum = Isa::Set1(bias_sum0 + bias_sum1);
  Vec sum[kSize];
#pragma GCC unroll 16
  for (int k = 0; k < kAcc; ++k) {
    sum[k] = kTwoSets ? Isa::Add(acc0[k], acc1[k]) : acc0[k];
  }
  if constexpr (Rows::kPairedLoads) {
#pragma GCC unroll 8
    for (int k = 0; k + 1 < kVecs; k += 2) {
      const Vec even = sum[k], odd = sum[k + 1];
      Isa::Interleave(even, odd, &sum[k], &sum[k + 1]);
    }
  }
#pragma GCC unroll 16
  for (int k = 0; k < kAcc; ++k) {
    Vec v = sum[k];
    if (Rows::kHasBias) v = Isa::Add(v, bias_sum);
    if (bag.zero) {
      v = Isa::Zero();
    } else if (a.combiner != Combiner::kSum) {
      v = Isa::Div(v, denom);  // a divide, as the reference: same rounding
    }
    if (kTail != 0 && k == kVecs) {
      Isa::StoreTail(out + d0 + k * W, v, tail);
    } else {
      Isa::Store(out + d0 + k * W, v);
    }
  }
  return true;
}

template <class Isa, class Rows, class Index, int kVecs, int kTail>
bool PoolBlockOutOfLine(const PoolArgs& a, const Index* ids,
                        const BagState& bag, int64_t d0, int runtime_tail,
                        bool prefetch, float* out) {
  return PoolBlock<Isa, Rows, Index, kVecs, kTail>(a, ids, bag, d0,
                                                   runtime_tail, prefetch, out);
}

// Most vectors one block holds in registers (the same for every ISA).
constexpr int kMaxBlockVecs = 8;

// A dimension known at compile time: blocks of kMax vectors, then one
// block with the remaining vectors and lanes, all counts constant.
template <class Isa, class Rows, class Index, int kDim>
struct FixedDimBlocks {
  TFCE_ALWAYS_INLINE static bool Run(const PoolArgs& a, const Index* ids,
                                     const BagState& bag, float* out) {
    constexpr int W = Isa::kLanes;
    constexpr int kMax = kMaxBlockVecs;
    constexpr int kFullBlocks = kDim / W / kMax;
    constexpr int kRestVecs = kDim / W % kMax;
    constexpr int kTailLanes = kDim % W;
    for (int b = 0; b < kFullBlocks; ++b) {
      if (!PoolBlock<Isa, Rows, Index, kMax, 0>(a, ids, bag, b * kMax * W, 0,
                                                b == 0, out)) {
        return false;
      }
    }
    if (kRestVecs == 0 && kTailLanes == 0) return true;
    return PoolBlock<Isa, Rows, Index, kRestVecs, kTailLanes>(
        a, ids, bag, kFullBlocks * kMax * W, kTailLanes, kFullBlocks == 0, out);
  }
};

// The remainder block of a runtime dimension, by its vector count.
template <class Isa, class Rows, class Index, int kTail, int kVecs = 0>
bool PoolRemainderByVecs(const PoolArgs& a, const Index* ids,
                         const BagState& bag, int64_t d0, int vecs, int tail,
                         bool prefetch, float* out) {
  if constexpr (kVecs + 1 < kMaxBlockVecs) {
    if (vecs > kVecs) {
      return PoolRemainderByVecs<Isa, Rows, Index, kTail, kVecs + 1>(
          a, ids, bag, d0, vecs, tail, prefetch, out);
    }
  }
  return PoolBlockOutOfLine<Isa, Rows, Index, kVecs, kTail>(
      a, ids, bag, d0, tail, prefetch, out);
}

// Any dimension: full blocks of kMax vectors, then one remainder block.
template <class Isa, class Rows, class Index>
struct RuntimeDimBlocks {
  static bool Run(const PoolArgs& a, const Index* ids, const BagState& bag,
                  float* out) {
    constexpr int W = Isa::kLanes;
    constexpr int kMax = kMaxBlockVecs;
    const int64_t dim = a.table.dim;
    int64_t d0 = 0;
    for (; d0 + kMax * W <= dim; d0 += kMax * W) {
      if (!PoolBlockOutOfLine<Isa, Rows, Index, kMax, 0>(a, ids, bag, d0, 0,
                                                         d0 == 0, out)) {
        return false;
      }
    }
    const int64_t rest = dim - d0;
    if (rest == 0) return true;
    const int vecs = static_cast<int>(rest / W);
    const int tail = static_cast<int>(rest % W);
    return tail ? PoolRemainderByVecs<Isa, Rows, Index, kRuntimeTail>(
                      a, ids, bag, d0, vecs, tail, d0 == 0, out)
                : PoolRemainderByVecs<Isa, Rows, Index, 0>(
                      a, ids, bag, d0, vecs, 0, d0 == 0, out);
  }
};

// All bags of a call, each by Blocks::Run (FixedDimBlocks or
// RuntimeDimBlocks). The loop over bags sits in the same function as a fixed
// dimension's blocks: no call per bag, which would cost bags of one id as
// much as their own work.
template <class Isa, class Rows, class Index, class Blocks>
bool PoolEachBag(const PoolArgs& args) {
  // A local copy, so its fields stay in registers: a vector store may alias
  // anything, and fields read through `args` would be reloaded after every
  // one. Making a fixed dim a constant here too measured slower on long bags
  // (benchmarks/op_bench.py; CHANGELOG.md), so it is not done.
  const PoolArgs a = args;
  const Index* ids = static_cast<const Index*>(a.ids.data);
  const int64_t prefetch_end = a.bag_offsets[a.bag_end];
  PrefetchFirstRows<Isa, Rows>(a.table, ids, a.bag_offsets[a.bag_begin],
                               prefetch_end, a.prefetch_rows);
  for (int64_t b = a.bag_begin; b < a.bag_end; ++b) {
    BagState bag;
    bag.begin = a.bag_offsets[b];
    bag.end = a.bag_offsets[b + 1];
    bag.prefetch_end = prefetch_end;
    // The denominator in the reference's order, so both agree exactly.
    float wsum = 0.0f, w2sum = 0.0f;
    if (a.combiner != Combiner::kSum) {
      for (int64_t i = bag.begin; i < bag.end; ++i) {
        const float w = a.weights ? a.weights[i] : 1.0f;
        wsum = wsum + w;
        w2sum = w2sum + w * w;
      }
    }
    bag.denom = a.combiner == Combiner::kMean    ? wsum
                : a.combiner == Combiner::kSqrtN ? __builtin_sqrtf(w2sum)
                                                 : 1.0f;
    bag.zero = bag.denom == 0.0f;
    if (!Blocks::Run(a, ids, bag, a.out + b * a.out_stride)) return false;
  }
  return true;
}

// The per-call choice of the blocks: the first of kDim, kDims... equal to the
// table's dim gets its fully unrolled FixedDimBlocks, any other dim
// RuntimeDimBlocks.
template <class Isa, class Rows, class Index, int kDim, int... kDims>
bool PoolByDimAmong(const PoolArgs& a) {
  if (a.table.dim == kDim) {
    return PoolEachBag<Isa, Rows, Index,
                       FixedDimBlocks<Isa, Rows, Index, kDim>>(a);
  }
  if constexpr (sizeof...(kDims) > 0) {
    return PoolByDimAmong<Isa, Rows, Index, kDims...>(a);
  } else {
    return PoolEachBag<Isa, Rows, Index, RuntimeDimBlocks<Isa, Rows, Index>>(a);
  }
}

// The dims that get fully unrolled blocks (FixedDimBlocks); any other dim
// runs the runtime-dim blocks.
template <class Isa, class Rows, class Index>
bool PoolByDim(const PoolArgs& a) {
  return PoolByDimAmong<Isa, Rows, Index, 8, 12, 16, 32, 64, 128>(a);
}

template <class Isa, template <class> class Rows>
bool LookupByIndexWidth(const LookupArgs& a) {
  return a.ids.is_int64 ? LookupIds<Isa, Rows<Isa>, int64_t>(a)
                        : LookupIds<Isa, Rows<Isa>, int32_t>(a);
}

template <class Isa, template <class> class Rows>
bool PoolByIndexWidth(const PoolArgs& a) {
  return a.ids.is_int64 ? PoolByDim<Isa, Rows<Isa>, int64_t>(a)
                        : PoolByDim<Isa, Rows<Isa>, int32_t>(a);
}

// The two entry points an ISA file exports through the dispatch table, by
// storage format, then id width, then (pool) dim.
template <class Isa>
bool LookupByStorage(const LookupArgs& args) {
  switch (args.table.storage) {
    case Storage::kInt8Split:
      return LookupByIndexWidth<Isa, Int8SplitRows>(args);
    case Storage::kFp16:
      return LookupByIndexWidth<Isa, HalfRows>(args);
    case Storage::kInt8Rowwise:
      return LookupByIndexWidth<Isa, Int8RowwiseRows>(args);
    case Storage::kInt4Rowwise:
      return LookupByIndexWidth<Isa, Int4RowwiseRows>(args);
  }
  return false;
}

template <class Isa>
bool PoolByStorage(const PoolArgs& args) {
  switch (args.table.storage) {
    case Storage::kInt8Split:
      return PoolByIndexWidth<Isa, Int8SplitRows>(args);
    case Storage::kFp16:
      return PoolByIndexWidth<Isa, HalfRows>(args);
    case Storage::kInt8Rowwise:
      return PoolByIndexWidth<Isa, Int8RowwiseRows>(args);
    case Storage::kInt4Rowwise:
      return PoolByIndexWidth<Isa, Int4RowwiseRows>(args);
  }
  return false;
}

}  // namespace
}  // namespace tfce

// Defines the entry points of the kernel variant `name` (a line of
// kernel_variants.inc) over the traits struct `Isa`: tfce::name::Lookup and
// tfce::name::Pool, the only symbols an ISA file exports.
#define TFCE_DEFINE_SIMD_KERNEL_VARIANT(name, Isa)                           \
  namespace tfce {                                                           \
  namespace name {                                                           \
  bool Lookup(const LookupArgs& args) { return LookupByStorage<Isa>(args); } \
  bool Pool(const PoolArgs& args) { return PoolByStorage<Isa>(args); }       \
  }                                                                          \
  }

#endif  // TFCE_KERNELS_CORE_SIMD_KERNELS_INL_H_
