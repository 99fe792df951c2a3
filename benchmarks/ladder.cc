// The ladder: what each kernel technique buys, one step at a time, with no
// TensorFlow in the loop. Each step pools 512 bags of weighted int8 or fp16
// rows; FP32 pooling is the baseline. Steps 0-4 are written here for the
// comparison, on the int8_split layout (int8 values, scales in a separate
// array: 0.1.0's int8) and fp16; steps 5-6 are the shipped AVX2 kernels
// (kernels/core/kernel_avx2.cc) without and with prefetch, called through the
// dispatch table, on those two and on the rowwise int8 and int4 records
// (tf_compressed_embedding/quantization.py) of the same values.
//
//   fp32     FP32 table, AVX2 FMA pooling (the baseline), and fp32+pref
//            with the shipped kernel's prefetch rule (tfce::PrefetchDistance)
//   0 naive  scalar decode of each row to an FP32 buffer, then scalar pool
//   1 simd   SIMD decode to the buffer (lanes built element by element),
//            SIMD pool from the buffer; scalar remainder
//   2 +rem4  + a 4-lane vector path for the remainder (dim 12 = 8 + 4)
//   3 +load  + contiguous 8-byte loads widened in registers
//   4 +fused decode fused into the FMA accumulation, no FP32 buffer
//   5 +shape the shipped kernel without prefetch: dims specialised at compile
//            time, accumulators in registers, two accumulator sets
//   6 +pref  the shipped kernel: + software prefetch PrefetchDistance ids ahead
//            (as the ops do for a table beyond the cache)
// Formats in the CSV: int8_split, fp16 (every step), int8 and int4 rowwise
// (steps 5-6 and the sweep).
//
// Usage: ladder ROWS DIM BAGS IDS_PER_BAG REPEATS [PREFETCH,...]
// CSV lines on stdout. With a list of prefetch distances, only the shipped
// kernel runs, once per distance (step "prefetch=N").
// Built and run by benchmarks/ladder.py.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/core/dispatch.h"
#include "kernels/core/fp16.h"
#include "kernels/core/kernel_api.h"
#include "kernels/core/prefetch_policy.h"

namespace {

using tfce::Storage;

struct Workload {
  int64_t rows, dim, bags, per_bag;
  std::vector<int8_t> q;
  std::vector<float> scales;
  std::vector<uint16_t> half;
  std::vector<uint8_t> rec8;  // int8 rowwise records: [f32 scale][q]
  std::vector<uint8_t> rec4;  // int4 rowwise: [f16 scale][f16 bias][nibbles]
  std::vector<float> fp32;
  std::vector<std::vector<int64_t>> id_batches;  // rotating, defeats reuse
  std::vector<int64_t> offsets;
  std::vector<float> weights;
};

// ---------------------------------------------------------- steps 0-4

float DecodeScalar(const Workload& w, Storage s, int64_t id, int64_t d) {
  return s == Storage::kInt8Split ? w.q[id * w.dim + d] * w.scales[id]
                             : tfce::HalfBitsToFloat(w.half[id * w.dim + d]);
}

// Runs pool_id(o, i) for every id position i of every bag, o the bag's
// output row, zeroed first: the bag loop all the steps share.
template <typename PoolId>
inline void ForEachBag(const Workload& w, float* out, PoolId&& pool_id) {
  for (int64_t b = 0; b < w.bags; ++b) {
    float* o = out + b * w.dim;
    std::fill(o, o + w.dim, 0.0f);
    for (int64_t i = w.offsets[b]; i < w.offsets[b + 1]; ++i) pool_id(o, i);
  }
}

// Step 0: decode to a buffer, then pool, all scalar.
void Naive(const Workload& w, Storage s, const int64_t* ids, float* out) {
  std::vector<float> buf(w.dim);
  ForEachBag(w, out, [&](float* o, int64_t i) {
    for (int64_t d = 0; d < w.dim; ++d) buf[d] = DecodeScalar(w, s, ids[i], d);
    for (int64_t d = 0; d < w.dim; ++d) o[d] += w.weights[i] * buf[d];
  });
}

// Decodes 8 elements with lanes built one by one (what a first SIMD port
// of a scalar loop does).
__m256 DecodeLanes8(const Workload& w, Storage s, int64_t id, int64_t d) {
  if (s == Storage::kInt8Split) {
    const int8_t* p = &w.q[id * w.dim + d];
    const __m256 v =
        _mm256_setr_ps(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
    return _mm256_mul_ps(v, _mm256_set1_ps(w.scales[id]));
  }
  const uint16_t* p = &w.half[id * w.dim + d];
  return _mm256_cvtph_ps(
      _mm_setr_epi16(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]));
}

__m128 DecodeLanes4(const Workload& w, Storage s, int64_t id, int64_t d,
                    bool contiguous) {
  if (s == Storage::kInt8Split) {
    const int8_t* p = &w.q[id * w.dim + d];
    __m128 v;
    if (contiguous) {
      int32_t four;
      std::memcpy(&four, p, 4);
      v = _mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(four)));
    } else {
      v = _mm_setr_ps(p[0], p[1], p[2], p[3]);
    }
    return _mm_mul_ps(v, _mm_set1_ps(w.scales[id]));
  }
  const uint16_t* p = &w.half[id * w.dim + d];
  return contiguous
             ? _mm_cvtph_ps(
                   _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))
             : _mm_cvtph_ps(_mm_setr_epi16(p[0], p[1], p[2], p[3], 0, 0, 0, 0));
}

__m256 DecodeContiguous8(const Workload& w, Storage s, int64_t id, int64_t d) {
  if (s == Storage::kInt8Split) {
    const __m128i q =
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(&w.q[id * w.dim + d]));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                         _mm256_set1_ps(w.scales[id]));
  }
  return _mm256_cvtph_ps(_mm_loadu_si128(
      reinterpret_cast<const __m128i*>(&w.half[id * w.dim + d])));
}

// Steps 1-3: SIMD decode into a buffer, then SIMD pooling from it.
template <bool kRem4, bool kContiguous>
void DecodeThenPool(const Workload& w, Storage s, const int64_t* ids,
                    float* out) {
  std::vector<float> buf(w.dim + 8);
  const int64_t full = w.dim / 8 * 8;
  ForEachBag(w, out, [&](float* o, int64_t i) {
    const int64_t id = ids[i];
    int64_t d = 0;
    for (; d < full; d += 8) {
      _mm256_storeu_ps(&buf[d], kContiguous ? DecodeContiguous8(w, s, id, d)
                                            : DecodeLanes8(w, s, id, d));
    }
    if (kRem4 && d + 4 <= w.dim) {
      _mm_storeu_ps(&buf[d], DecodeLanes4(w, s, id, d, kContiguous));
      d += 4;
    }
    for (; d < w.dim; ++d) buf[d] = DecodeScalar(w, s, id, d);
    const __m256 wv = _mm256_set1_ps(w.weights[i]);
    d = 0;
    for (; d < full; d += 8) {
      _mm256_storeu_ps(o + d, _mm256_fmadd_ps(_mm256_loadu_ps(&buf[d]), wv,
                                              _mm256_loadu_ps(o + d)));
    }
    if (kRem4 && d + 4 <= w.dim) {
      _mm_storeu_ps(
          o + d, _mm_fmadd_ps(_mm_loadu_ps(&buf[d]), _mm_set1_ps(w.weights[i]),
                              _mm_loadu_ps(o + d)));
      d += 4;
    }
    for (; d < w.dim; ++d) o[d] += w.weights[i] * buf[d];
  });
}

// Step 4: decode fused into the FMA, per-row loop over the dimension, the
// output row as accumulator (runtime dim: no registers held across ids).
void FusedRuntimeDim(const Workload& w, Storage s, const int64_t* ids,
                     float* out) {
  const int64_t full = w.dim / 8 * 8;
  ForEachBag(w, out, [&](float* o, int64_t i) {
    const int64_t id = ids[i];
    const float f = w.weights[i] * (s == Storage::kInt8Split ? w.scales[id] : 1.0f);
    int64_t d = 0;
    for (; d < full; d += 8) {
      __m256 v;
      if (s == Storage::kInt8Split) {
        const __m128i q = _mm_loadl_epi64(
            reinterpret_cast<const __m128i*>(&w.q[id * w.dim + d]));
        v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
      } else {
        v = _mm256_cvtph_ps(_mm_loadu_si128(
            reinterpret_cast<const __m128i*>(&w.half[id * w.dim + d])));
      }
      _mm256_storeu_ps(
          o + d, _mm256_fmadd_ps(v, _mm256_set1_ps(f), _mm256_loadu_ps(o + d)));
    }
    if (d + 4 <= w.dim) {
      __m128 v;
      if (s == Storage::kInt8Split) {
        int32_t four;
        std::memcpy(&four, &w.q[id * w.dim + d], 4);
        v = _mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(four)));
      } else {
        v = _mm_cvtph_ps(_mm_loadl_epi64(
            reinterpret_cast<const __m128i*>(&w.half[id * w.dim + d])));
      }
      _mm_storeu_ps(o + d,
                    _mm_fmadd_ps(v, _mm_set1_ps(f), _mm_loadu_ps(o + d)));
      d += 4;
    }
    for (; d < w.dim; ++d) {
      o[d] += f * (s == Storage::kInt8Split
                       ? w.q[id * w.dim + d]
                       : tfce::HalfBitsToFloat(w.half[id * w.dim + d]));
    }
  });
}

// The FP32 baseline, written as well as step 4 (AVX2 FMA, 8 + 4 + rest),
// optionally with the same software prefetch as the shipped kernel.
void Fp32Pool(const Workload& w, const int64_t* ids, float* out,
              int64_t prefetch_rows) {
  const int64_t full = w.dim / 8 * 8;
  const int64_t n = w.offsets[w.bags];
  ForEachBag(w, out, [&](float* o, int64_t i) {
    if (prefetch_rows > 0 && i + prefetch_rows < n) {
      const char* ahead = reinterpret_cast<const char*>(
          &w.fp32[ids[i + prefetch_rows] * w.dim]);
      for (int64_t off = 0; off < w.dim * 4; off += 64) {
        _mm_prefetch(ahead + off, _MM_HINT_T0);
      }
      _mm_prefetch(ahead + w.dim * 4 - 1, _MM_HINT_T0);
    }
    const float* row = &w.fp32[ids[i] * w.dim];
    const __m256 wv = _mm256_set1_ps(w.weights[i]);
    int64_t d = 0;
    for (; d < full; d += 8) {
      _mm256_storeu_ps(o + d, _mm256_fmadd_ps(_mm256_loadu_ps(row + d), wv,
                                              _mm256_loadu_ps(o + d)));
    }
    if (d + 4 <= w.dim) {
      _mm_storeu_ps(
          o + d, _mm_fmadd_ps(_mm_loadu_ps(row + d), _mm_set1_ps(w.weights[i]),
                              _mm_loadu_ps(o + d)));
      d += 4;
    }
    for (; d < w.dim; ++d) o[d] += w.weights[i] * row[d];
  });
}

// ---------------------------------------------------------- steps 5-6

const tfce::KernelVariant& Variant(const char* name) {
  int n = 0;
  const tfce::KernelVariant* variants = tfce::KernelVariants(&n);
  for (int i = 0; i < n; ++i) {
    if (std::strcmp(variants[i].name, name) == 0) return variants[i];
  }
  std::fprintf(stderr, "no kernel variant %s\n", name);
  std::exit(2);
}

const char* FormatName(Storage s) {
  switch (s) {
    case Storage::kInt8Split:
      return "int8_split";
    case Storage::kFp16:
      return "fp16";
    case Storage::kInt8Rowwise:
      return "int8";
    case Storage::kInt4Rowwise:
      return "int4";
  }
  return "?";
}

tfce::TableView View(const Workload& w, Storage s) {
  const void* data = w.rec4.data();
  if (s == Storage::kInt8Split) data = w.q.data();
  if (s == Storage::kFp16) data = w.half.data();
  if (s == Storage::kInt8Rowwise) data = w.rec8.data();
  return tfce::TableView{s, data,
                         s == Storage::kInt8Split ? w.scales.data() : nullptr,
                         w.rows, w.dim};
}

void Shipped(const Workload& w, Storage s, const int64_t* ids, float* out,
             int64_t prefetch_rows) {
  static const tfce::KernelVariant& avx2 = Variant("avx2");
  tfce::PoolArgs a;
  a.table = View(w, s);
  a.ids = tfce::IdsView{ids, true};
  a.weights = w.weights.data();
  a.bag_offsets = w.offsets.data();
  a.combiner = tfce::Combiner::kSum;
  a.bag_begin = 0;
  a.bag_end = w.bags;
  a.out = out;
  a.out_stride = w.dim;
  a.prefetch_rows = prefetch_rows;
  if (!avx2.pool(a)) std::abort();
}

// ---------------------------------------------------------- timing

double MedianNsPerRow(const Workload& w,
                      const std::function<void(const int64_t*, float*)>& fn,
                      int repeats) {
  std::vector<float> out(w.bags * w.dim);
  size_t batch = 0;
  auto next = [&]() {
    return w.id_batches[batch++ % w.id_batches.size()].data();
  };
  // Calibrate to ~20 ms per repeat after a warm-up call.
  fn(next(), out.data());
  int calls = 1;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) fn(next(), out.data());
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    if (s > 0.02 || calls > (1 << 20)) break;
    calls *= 2;
  }
  std::vector<double> per_row;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) fn(next(), out.data());
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    per_row.push_back(s * 1e9 / calls / (w.bags * w.per_bag));
  }
  std::nth_element(per_row.begin(), per_row.begin() + per_row.size() / 2,
                   per_row.end());
  return per_row[per_row.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6 && argc != 7) {
    std::fprintf(stderr,
                 "usage: %s ROWS DIM BAGS IDS_PER_BAG REPEATS [PREFETCH,...]\n",
                 argv[0]);
    return 2;
  }
  Workload w;
  w.rows = std::atoll(argv[1]);
  w.dim = std::atoll(argv[2]);
  w.bags = std::atoll(argv[3]);
  w.per_bag = std::atoll(argv[4]);
  const int repeats = std::atoi(argv[5]);
  std::mt19937_64 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> q(-127, 127);
  w.q.resize(w.rows * w.dim);
  w.half.resize(w.rows * w.dim);
  w.fp32.resize(w.rows * w.dim);
  w.scales.resize(w.rows);
  for (int64_t r = 0; r < w.rows; ++r) w.scales[r] = 0.01f;
  for (int64_t i = 0; i < w.rows * w.dim; ++i) {
    w.q[i] = static_cast<int8_t>(q(rng));
    w.fp32[i] = w.q[i] * 0.01f;
    const _Float16 h = static_cast<_Float16>(w.fp32[i]);
    std::memcpy(&w.half[i], &h, 2);
  }
  // The same int8 values as rowwise records; int4 records of their top
  // nibbles (values only matter for the checksum-free timing: any valid
  // record decodes at the same speed).
  const int64_t bytes8 = tfce::RecordBytes(Storage::kInt8Rowwise, w.dim);
  const int64_t bytes4 = tfce::RecordBytes(Storage::kInt4Rowwise, w.dim);
  w.rec8.assign(w.rows * bytes8, 0);
  w.rec4.assign(w.rows * bytes4, 0);
  const _Float16 meta4[2] = {static_cast<_Float16>(0.17f),
                             static_cast<_Float16>(-1.27f)};
  for (int64_t r = 0; r < w.rows; ++r) {
    uint8_t* rec = &w.rec8[r * bytes8];
    std::memcpy(rec, &w.scales[r], 4);
    std::memcpy(rec + 4, &w.q[r * w.dim], w.dim);
    uint8_t* nib = &w.rec4[r * bytes4];
    std::memcpy(nib, meta4, 4);
    for (int64_t d = 0; d < w.dim; ++d) {
      const uint8_t v = static_cast<uint8_t>((w.q[r * w.dim + d] + 128) >> 4);
      nib[4 + d / 2] |= d % 2 ? v << 4 : v;
    }
  }
  std::uniform_int_distribution<int64_t> pick(0, w.rows - 1);
  const int64_t per_call = w.bags * w.per_bag;
  const int64_t pool_ids = std::max<int64_t>(per_call, 1 << 20);
  for (int64_t made = 0; made < pool_ids; made += per_call) {
    std::vector<int64_t> ids(per_call);
    for (auto& id : ids) id = pick(rng);
    w.id_batches.push_back(std::move(ids));
  }
  for (int64_t b = 0; b <= w.bags; ++b) w.offsets.push_back(b * w.per_bag);
  std::uniform_real_distribution<float> uw(0.5f, 1.5f);
  w.weights.resize(per_call);
  for (auto& x : w.weights) x = uw(rng);

  struct Step {
    std::string name;
    std::function<void(Storage, const int64_t*, float*)> fn;
  };
  const std::vector<Step> steps = {
      {"0 naive",
       [&](Storage s, const int64_t* ids, float* o) { Naive(w, s, ids, o); }},
      {"1 simd", [&](Storage s, const int64_t* ids,
                     float* o) { DecodeThenPool<false, false>(w, s, ids, o); }},
      {"2 +rem4", [&](Storage s, const int64_t* ids,
                      float* o) { DecodeThenPool<true, false>(w, s, ids, o); }},
      {"3 +load", [&](Storage s, const int64_t* ids,
                      float* o) { DecodeThenPool<true, true>(w, s, ids, o); }},
      {"4 +fused", [&](Storage s, const int64_t* ids,
                       float* o) { FusedRuntimeDim(w, s, ids, o); }},
      {"5 +shape", [&](Storage s, const int64_t* ids,
                       float* o) { Shipped(w, s, ids, o, 0); }},
      {"6 +pref",
       [&](Storage s, const int64_t* ids, float* o) {
         Shipped(w, s, ids, o, tfce::PrefetchDistance(View(w, s)));
       }},
  };
  const Storage all_formats[] = {Storage::kInt8Split, Storage::kFp16,
                                 Storage::kInt8Rowwise, Storage::kInt4Rowwise};
  // Steps 0-4 are written for the first two layouts only.
  auto runs_step = [](Storage s, const std::string& step) {
    return s == Storage::kInt8Split || s == Storage::kFp16 || step[0] >= '5';
  };
  std::printf("rows,dim,per_bag,format,step,ns_per_row\n");
  if (argc == 7) {  // prefetch distance sweep of the shipped kernel
    std::vector<int64_t> distances;
    for (char* p = argv[6]; *p;) {
      distances.push_back(std::strtoll(p, &p, 10));
      if (*p == ',') ++p;
    }
    for (Storage s : all_formats) {
      for (int64_t dist : distances) {
        const double ns = MedianNsPerRow(
            w,
            [&](const int64_t* ids, float* o) { Shipped(w, s, ids, o, dist); },
            repeats);
        std::printf("%lld,%lld,%lld,%s,prefetch=%lld,%.3f\n", (long long)w.rows,
                    (long long)w.dim, (long long)w.per_bag, FormatName(s),
                    (long long)dist, ns);
        std::fflush(stdout);
      }
    }
    return 0;
  }
  for (const int64_t prefetch :
       {int64_t{0}, tfce::PrefetchDistance(4 * w.dim, false)}) {
    const double fp32 = MedianNsPerRow(
        w, [&](const int64_t* ids, float* o) { Fp32Pool(w, ids, o, prefetch); },
        repeats);
    std::printf("%lld,%lld,%lld,fp32,%s,%.3f\n", (long long)w.rows,
                (long long)w.dim, (long long)w.per_bag,
                prefetch ? "fp32+pref" : "fp32", fp32);
  }
  for (Storage s : all_formats) {
    for (const Step& step : steps) {
      if (!runs_step(s, step.name)) continue;
      const double ns = MedianNsPerRow(
          w, [&](const int64_t* ids, float* o) { step.fn(s, ids, o); },
          repeats);
      std::printf("%lld,%lld,%lld,%s,%s,%.3f\n", (long long)w.rows,
                  (long long)w.dim, (long long)w.per_bag, FormatName(s),
                  step.name.c_str(), ns);
      std::fflush(stdout);
    }
  }
  return 0;
}
