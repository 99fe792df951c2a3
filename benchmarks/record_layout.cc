// Where the int8 rowwise record keeps its scale, and at what stride: the
// same pooling loop over five record layouts, only the address arithmetic
// differing. No TensorFlow in the loop. Layouts of a row of D int8 values
// and its float32 scale:
//   a scale_first  [scale][D values], stride 4 + D   (what is shipped,
//                  tf_compressed_embedding/quantization.py's "int8")
//   b scale_last   [D values][scale], stride D + 4
//   c pad8         as a, stride rounded up to a multiple of 8
//   d pad16        as a, stride rounded up to a multiple of 16
//   e pad64        as a, stride rounded up to a multiple of 64 (every record
//                  starts a cache line: one line per row up to D = 60)
// The loop, per ISA of this build (the same source is built once per ISA):
//   avx2    8 floats a vector; int8 loads of exactly the row's bytes (8 at a
//           time, then 4), as kernels/core/kernel_avx2.cc
//   avx512  16 a vector; a tail (D % 16) is one masked 16-byte load, as
//           kernels/core/kernel_avx512.cc: the masked-off bytes are not
//           read, but the load may still wait for the line they fall in
//   avx512_exact  (built with -DRL_EXACT_TAIL) the same with the tail loaded
//           exactly (8 and 4-byte loads): what the AVX-512 kernel would do
//           with exact tails
// Both: the row's scale folded into the weight, one FMA per vector,
// accumulators in registers for blocks of up to 8 vectors, two accumulator
// sets for blocks of 1 or 2 vectors, prefetch of every line of the record
// `distance` ids ahead (and of the first `distance` rows at once) in the
// first block: the shipped kernel's structure
// (kernels/core/simd_kernels_inl.h). The distance follows the ops' policy
// (kernels/core/prefetch_policy.h) for a record of the layout's stride:
// none for bags of 8+ ids of rows under 64 bytes in a table of at most 8x
// one core's L2, else PrefetchDistance(stride). As a cross-check the shipped
// kernel (the dispatch table's choice) also runs on layout a ("kernel").
//
// Every layout holds the same values: all loops' outputs are checked against
// a float64 reference before timing.
//
// Usage: record_layout ROWS DIM REPEATS LENS HUGE(0|1)   LENS: e.g. 20,80
// CSV on stdout:
//   L,layout,loop,stride,scale_offset,lines_per_row,prefetch,ns_per_row,
//   min_ns_per_row (ns_per_row: the median over the repeats)
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "benchmarks/bench_memory.h"
#include "kernels/core/cpu_features.h"
#include "kernels/core/dispatch.h"
#include "kernels/core/kernel_api.h"
#include "kernels/core/prefetch_policy.h"

namespace {

using bench::kBags;

#define RL_ALWAYS_INLINE inline __attribute__((always_inline))

struct Layout {
  const char* name;
  int64_t stride;
  int64_t scale_offset;
  int64_t values_offset;
  uint8_t* data;
};

// Always inlined: a function holding only a prefetch looks side-effect
// free to GCC, which then deletes its calls.
RL_ALWAYS_INLINE void Prefetch(const void* p) {
  _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
}

#ifdef __AVX512BW__
#ifdef RL_EXACT_TAIL
constexpr const char* kLoop = "avx512_exact";
#else
constexpr const char* kLoop = "avx512";
#endif
struct Isa {
  static constexpr int kLanes = 16;
  using Vec = __m512;
  static Vec Zero() { return _mm512_setzero_ps(); }
  static Vec Set1(float x) { return _mm512_set1_ps(x); }
  static Vec MulAdd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec Add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static void Store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec Load(const int8_t* p) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
  }
  static __mmask16 Mask(int n) { return static_cast<__mmask16>((1u << n) - 1); }
#ifdef RL_EXACT_TAIL
  // The tail's bytes exactly (the dims measured leave tails of 4, 8 or 12
  // values): 8 and 4-byte loads, nothing past the row.
  static Vec LoadTail(const int8_t* p, int n) {
    if (n % 4) std::abort();
    __m128i q = n >= 8 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))
                       : _mm_setzero_si128();
    if (n % 8) {
      int32_t four;
      std::memcpy(&four, p + n - 4, 4);
      q = _mm_insert_epi32(q, four, n >= 8 ? 2 : 0);
    }
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
  }
#else
  static Vec LoadTail(const int8_t* p, int n) {
    const __m128i q = _mm_maskz_loadu_epi8(Mask(n), p);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
  }
#endif
  static void StoreTail(float* p, Vec v, int n) {
    _mm512_mask_storeu_ps(p, Mask(n), v);
  }
};
#else
constexpr const char* kLoop = "avx2";
struct Isa {
  static constexpr int kLanes = 8;
  using Vec = __m256;
  static Vec Zero() { return _mm256_setzero_ps(); }
  static Vec Set1(float x) { return _mm256_set1_ps(x); }
  static Vec MulAdd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec Add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static void Store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec Load(const int8_t* p) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  }
  // The dims measured are multiples of 4: a tail is 4 values, one exact
  // 4-byte load.
  static Vec LoadTail(const int8_t* p, int n) {
    if (n != 4) std::abort();
    int32_t four;
    std::memcpy(&four, p, 4);
    return _mm256_zextps128_ps256(
        _mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(four))));
  }
  static void StoreTail(float* p, Vec v, int n) {
    if (n != 4) std::abort();
    _mm_storeu_ps(p, _mm256_castps256_ps128(v));
  }
};
#endif

struct Args {
  const Layout* layout;
  int64_t record_bytes;  // 4 + D: what is prefetched of each record
  const int64_t* ids;
  const float* weights;
  int64_t per_bag;
  int64_t distance;
  float* out;
};

RL_ALWAYS_INLINE void PrefetchRecord(const Args& a, int64_t id) {
  const char* p = reinterpret_cast<const char*>(a.layout->data) +
                  id * a.layout->stride;
  for (int64_t off = 0; off < a.record_bytes; off += 64) Prefetch(p + off);
  Prefetch(p + a.record_bytes - 1);
}

// acc[0..kVecs) (+ acc[kVecs] for a tail) += factor * values of id `i`,
// elements [d0, d0 + kVecs * W + kTail).
template <int kVecs, int kTail>
RL_ALWAYS_INLINE void AccumulateId(const Args& a, int64_t i, int64_t d0,
                                   int64_t prefetch_end, bool prefetch,
                                   Isa::Vec* acc) {
  constexpr int W = Isa::kLanes;
  const Layout& l = *a.layout;
  const int64_t id = a.ids[i];
  if (prefetch && a.distance > 0 && i + a.distance < prefetch_end) {
    PrefetchRecord(a, a.ids[i + a.distance]);
  }
  const uint8_t* record = l.data + id * l.stride;
  float scale;
  std::memcpy(&scale, record + l.scale_offset, 4);
  const int8_t* values =
      reinterpret_cast<const int8_t*>(record + l.values_offset) + d0;
  const Isa::Vec factor = Isa::Set1(a.weights[i] * scale);
#pragma GCC unroll 16
  for (int k = 0; k < kVecs; ++k) {
    acc[k] = Isa::MulAdd(Isa::Load(values + k * W), factor, acc[k]);
  }
  if (kTail) {
    acc[kVecs] = Isa::MulAdd(Isa::LoadTail(values + kVecs * W, kTail), factor,
                             acc[kVecs]);
  }
}

// One block of bag `b`: kVecs vectors and a tail from element d0.
template <int kVecs, int kTail>
RL_ALWAYS_INLINE void PoolBlock(const Args& a, int64_t b, int64_t d0,
                                bool prefetch, int64_t dim) {
  constexpr int W = Isa::kLanes;
  constexpr int kAcc = kVecs + (kTail ? 1 : 0);
  constexpr bool kTwoSets = kAcc <= 2;
  const int64_t end = kBags * a.per_bag;
  Isa::Vec acc0[kAcc], acc1[kAcc];
#pragma GCC unroll 16
  for (int k = 0; k < kAcc; ++k) acc0[k] = acc1[k] = Isa::Zero();
  int64_t i = b * a.per_bag;
  const int64_t bag_end = i + a.per_bag;
  if (kTwoSets) {
    for (; i + 2 <= bag_end; i += 2) {
      AccumulateId<kVecs, kTail>(a, i, d0, end, prefetch, acc0);
      AccumulateId<kVecs, kTail>(a, i + 1, d0, end, prefetch, acc1);
    }
  }
  for (; i < bag_end; ++i) {
    AccumulateId<kVecs, kTail>(a, i, d0, end, prefetch, acc0);
  }
  float* out = a.out + b * dim + d0;
#pragma GCC unroll 16
  for (int k = 0; k < kAcc; ++k) {
    const Isa::Vec v = kTwoSets ? Isa::Add(acc0[k], acc1[k]) : acc0[k];
    if (kTail && k == kVecs) {
      Isa::StoreTail(out + k * W, v, kTail);
    } else {
      Isa::Store(out + k * W, v);
    }
  }
}

// Every bag, each by blocks of 8 vectors, then the rest and the tail (the
// shipped kernel's PoolEachBag over FixedDimBlocks); the first rows of the
// call prefetched at once.
template <int kDim>
void Pool(const Args& a) {
  constexpr int W = Isa::kLanes;
  constexpr int kMax = 8;
  constexpr int kFull = kDim / W / kMax;
  constexpr int kRest = kDim / W % kMax;
  constexpr int kTail = kDim % W;
  const int64_t end = kBags * a.per_bag;
  for (int64_t i = 0; i < std::min(a.distance, end); ++i) {
    PrefetchRecord(a, a.ids[i]);
  }
  for (int64_t b = 0; b < kBags; ++b) {
    for (int k = 0; k < kFull; ++k) {
      PoolBlock<kMax, 0>(a, b, k * kMax * W, k == 0, kDim);
    }
    if (kRest || kTail) {
      PoolBlock<kRest, kTail>(a, b, kFull * kMax * W, kFull == 0, kDim);
    }
  }
}

void PoolDim(const Args& a, int64_t dim) {
  switch (dim) {
    case 12:
      return Pool<12>(a);
    case 16:
      return Pool<16>(a);
    case 32:
      return Pool<32>(a);
    case 64:
      return Pool<64>(a);
    case 128:
      return Pool<128>(a);
  }
  std::fprintf(stderr, "dim must be one of 12, 16, 32, 64, 128\n");
  std::exit(2);
}

// The ops' prefetch rule (PoolPrefetchRows) for a record of `stride` bytes.
int64_t PolicyDistance(int64_t rows, int64_t stride, int64_t per_bag) {
  if (per_bag >= tfce::kLongBagIds && stride < 64 &&
      static_cast<double>(rows) * stride <=
          static_cast<double>(tfce::kCachedTableL2Multiple) *
              tfce::GetCpuFeatures().l2_cache_bytes) {
    return 0;
  }
  return tfce::PrefetchDistance(stride, false);
}

double LinesPerRow(const Layout& l, int64_t record_bytes,
                   const std::vector<int64_t>& ids) {
  int64_t lines = 0;
  for (int64_t id : ids) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(l.data + id * l.stride);
    lines += static_cast<int64_t>(((p + record_bytes - 1) >> 6) - (p >> 6) + 1);
  }
  return static_cast<double>(lines) / ids.size();
}

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr,
                 "usage: record_layout ROWS DIM REPEATS LENS HUGE(0|1)\n");
    return 2;
  }
  const int64_t rows = std::atoll(argv[1]), dim = std::atoll(argv[2]);
  const int repeats = std::atoi(argv[3]);
  std::vector<int64_t> lens;
  for (char* p = argv[4]; *p;) {
    lens.push_back(std::strtoll(p, &p, 10));
    if (*p == ',') ++p;
  }
  const bool huge = std::atoi(argv[5]) != 0;
  const int64_t record = 4 + dim;
  Layout layouts[] = {
      {"a_scale_first", record, 0, 4, nullptr},
      {"b_scale_last", record, dim, 0, nullptr},
      {"c_pad8", RoundUp(record, 8), 0, 4, nullptr},
      {"d_pad16", RoundUp(record, 16), 0, 4, nullptr},
      {"e_pad64", RoundUp(record, 64), 0, 4, nullptr},
  };
  // The same values in every layout: q = a hash of (row, d), scales vary.
  for (Layout& l : layouts) {
    l.data = static_cast<uint8_t*>(bench::Table(rows * l.stride, huge));
    for (int64_t r = 0; r < rows; ++r) {
      uint8_t* rec = l.data + r * l.stride;
      const float scale = (1.0f + static_cast<float>(r % 7) / 8) / 127;
      std::memcpy(rec + l.scale_offset, &scale, 4);
      for (int64_t d = 0; d < dim; ++d) {
        rec[l.values_offset + d] =
            static_cast<uint8_t>((r * 131 + d * 7) % 255 - 127);
      }
    }
  }
  const tfce::KernelVariant& kernels = bench::SelectedVariantOrExit();
  std::printf(
      "L,layout,loop,stride,scale_offset,lines_per_row,prefetch,ns_per_row,"
      "min_ns_per_row\n");
  for (int64_t per_bag : lens) {
    const auto batches = bench::IdBatches(rows, per_bag);
    const int64_t n = kBags * per_bag;
    std::vector<float> weights(n);
    for (int64_t i = 0; i < n; ++i) weights[i] = 0.5f + (i % 101) / 101.0f;
    std::vector<int64_t> offsets(kBags + 1);
    for (int64_t b = 0; b <= kBags; ++b) offsets[b] = b * per_bag;
    std::vector<float> out(kBags * dim);

    struct System {
      std::string layout, loop;
      const Layout* l;
      int64_t distance;
      std::function<void(const int64_t* ids)> run;
      std::vector<double> ns;
    };
    std::vector<System> systems;
    for (const Layout& l : layouts) {
      const int64_t distance = PolicyDistance(rows, l.stride, per_bag);
      systems.push_back({l.name, kLoop, &l, distance,
                         [&, distance, lp = &l](const int64_t* ids) {
                           PoolDim(Args{lp, record, ids, weights.data(),
                                        per_bag, distance, out.data()},
                                   dim);
                         },
                         {}});
    }
    // The shipped kernel on layout a (its own layout): the cross-check.
    tfce::PoolArgs args{};
    args.table = tfce::TableView{tfce::Storage::kInt8Rowwise, layouts[0].data,
                                 nullptr, rows, dim};
    args.weights = weights.data();
    args.bag_offsets = offsets.data();
    args.combiner = tfce::Combiner::kSum;
    args.bag_begin = 0;
    args.bag_end = kBags;
    args.out = out.data();
    args.out_stride = args.table.dim;
    args.prefetch_rows = tfce::PoolPrefetchRows(args.table, per_bag);
    systems.push_back({layouts[0].name, std::string("kernel_") + kernels.name,
                       &layouts[0], args.prefetch_rows,
                       [&](const int64_t* ids) {
                         tfce::PoolArgs a = args;
                         a.ids = tfce::IdsView{ids, true};
                         if (!kernels.pool(a)) std::abort();
                       },
                       {}});

    // Every system against a float64 reference on batch 0.
    const std::vector<int64_t>& ids0 = batches[0];
    std::vector<double> ref(kBags * dim, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = ids0[i];
      const double scale =
          static_cast<double>((1.0f + static_cast<float>(r % 7) / 8) / 127);
      for (int64_t d = 0; d < dim; ++d) {
        const int8_t q = static_cast<int8_t>((r * 131 + d * 7) % 255 - 127);
        ref[(i / per_bag) * dim + d] += weights[i] * scale * q;
      }
    }
    for (System& s : systems) {
      std::fill(out.begin(), out.end(), -1.0f);
      s.run(ids0.data());
      for (int64_t k = 0; k < kBags * dim; ++k) {
        if (std::fabs(out[k] - ref[k]) > 1e-4 * (1 + std::fabs(ref[k]))) {
          std::fprintf(stderr, "%s %s: out[%lld] = %g, want %g\n",
                       s.layout.c_str(), s.loop.c_str(),
                       static_cast<long long>(k), out[k], ref[k]);
          return 1;
        }
      }
    }

    // Round-robin over the systems (drift on a shared machine hits all
    // alike); about 2M looked-up rows per repeat.
    const int iters = static_cast<int>(std::max<int64_t>(4, 2000000 / n));
    size_t next = 0;
    auto run = [&](System& s, int count) {
      for (int it = 0; it < count; ++it) {
        s.run(batches[next++ % batches.size()].data());
      }
    };
    for (System& s : systems) run(s, iters / 4 + 1);
    for (int r = 0; r < repeats; ++r) {
      for (size_t k = 0; k < systems.size(); ++k) {
        System& s = systems[(k + r) % systems.size()];
        const auto t0 = std::chrono::steady_clock::now();
        run(s, iters);
        const double sec =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count();
        s.ns.push_back(sec / iters / n * 1e9);
      }
    }
    for (System& s : systems) {
      std::sort(s.ns.begin(), s.ns.end());
      std::printf("%lld,%s,%s,%lld,%lld,%.3f,%lld,%.3f,%.3f\n",
                  static_cast<long long>(per_bag), s.layout.c_str(),
                  s.loop.c_str(), static_cast<long long>(s.l->stride),
                  static_cast<long long>(s.l->scale_offset),
                  LinesPerRow(*s.l, record, ids0),
                  static_cast<long long>(s.distance), s.ns[s.ns.size() / 2],
                  s.ns[0]);
      std::fflush(stdout);
    }
  }
  return 0;
}
