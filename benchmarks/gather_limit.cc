// The random-gather limit of this machine for each table layout, next to the
// shipped pooling kernel on the same memory. No TensorFlow in the loop.
//
// "touch" reads one byte of every 64-byte line a looked-up row occupies (and,
// for the int8_split layout, of its scale's line) and adds it to a register:
// no decode, no FMA, only the memory traffic a pooling kernel cannot avoid.
// It prefetches like the kernel (every line, the first rows of a call at
// once) at distances 0, 16, 32, 64 and PrefetchDistance rows; the best is the
// limit. Layouts (tf_compressed_embedding/quantization.py defines tfce's):
//   int8        tfce int8 (rowwise): records [f32 scale][D x int8], 4 + D
//               bytes
//   int4        tfce int4 (rowwise): records [f16 scale][f16 bias][nibbles],
//               4 + ceil(D/2) bytes
//   fp16        tfce fp16: half [R, D]
//   int8_split  tfce int8_split (0.1.0's int8): int8 [R, D] and a separate
//               float32 scales [R] (a second random line per row)
//   fbgemm8     FBGEMM's 8-bit rowwise: D bytes + fp32 scale + fp32 bias
//               inline, D + 8 bytes (touched only: FBGEMM runs its own kernel)
//   fbgemm4     FBGEMM's 4-bit rowwise: ceil(D/2) bytes + fp16 scale + fp16
//               bias, ceil(D/2) + 4 bytes (touched only)
// The tfce layouts are then pooled by the shipped kernel on the same memory.
//
// Usage: gather_limit ROWS DIM IDS_PER_BAG THREADS HUGE(0|1) REPEATS
// CSV on stdout: layout,what,prefetch,ns_per_row,lines_per_row
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/bench_memory.h"
#include "kernels/core/dispatch.h"
#include "kernels/core/kernel_api.h"
#include "kernels/core/prefetch_policy.h"

namespace {

using bench::kBags;

struct Layout {
  const char* name;
  const char* rows;  // row bytes, start of row r at rows + r * stride
  int64_t stride;
  int64_t row_bytes;
  const char* scales;  // separate 4-byte scales, or null
  bool kernel;         // a tfce layout: the shipped kernel pools it too
  tfce::Storage storage;
};

// Always inlined: a prefetch has no effect GCC can see, so an out-of-line
// function holding only prefetches is found side-effect free and every call
// to it is deleted (the kernels do the same, kernels/core/simd_kernels_inl.h).
// Before this was forced, the "limit" measured no prefetch at all.
#define BENCH_ALWAYS_INLINE inline __attribute__((always_inline))

BENCH_ALWAYS_INLINE void Prefetch(const char* p) { __builtin_prefetch(p, 0, 3); }

// Every line of row `id` (and its scale), as the kernel prefetches them.
BENCH_ALWAYS_INLINE void PrefetchRow(const Layout& l, int64_t id) {
  const char* row = l.rows + id * l.stride;
  for (int64_t off = 0; off < l.row_bytes; off += 64) Prefetch(row + off);
  Prefetch(row + l.row_bytes - 1);
  if (l.scales) Prefetch(l.scales + id * 4);
}

// One byte read.
BENCH_ALWAYS_INLINE int64_t Read(const char* p) {
  return *reinterpret_cast<const volatile char*>(p);
}

// Sum of one byte per line of each row (and scale) of ids [begin, end),
// prefetching `distance` ids ahead and the first `distance` rows at once,
// as the kernel does. The bytes read are those the prefetches name (every
// 64th of the row and its last): the same trip count for every row, so the
// loop has no branch that depends on where a row falls.
int64_t Touch(const Layout& l, const int64_t* ids, int64_t begin, int64_t end,
              int64_t distance) {
  int64_t sum = 0;
  for (int64_t i = begin; i < end && i < begin + distance; ++i) {
    PrefetchRow(l, ids[i]);
  }
  for (int64_t i = begin; i < end; ++i) {
    if (distance > 0 && i + distance < end) PrefetchRow(l, ids[i + distance]);
    const char* row = l.rows + ids[i] * l.stride;
    for (int64_t off = 0; off < l.row_bytes; off += 64) sum += Read(row + off);
    sum += Read(row + l.row_bytes - 1);
    if (l.scales) sum += Read(l.scales + ids[i] * 4);
  }
  return sum;
}

double LinesPerRow(const Layout& l, const std::vector<int64_t>& ids) {
  int64_t lines = 0;
  for (int64_t id : ids) {
    const uintptr_t row = reinterpret_cast<uintptr_t>(l.rows + id * l.stride);
    lines +=
        static_cast<int64_t>(((row + l.row_bytes - 1) >> 6) - (row >> 6) + 1);
    if (l.scales) ++lines;
  }
  return static_cast<double>(lines) / ids.size();
}

// Median ns per looked-up row of fn(batch, bag_begin, bag_end). With several
// threads each takes an equal share of the bags of every batch; threads start
// once per repeat (no join per batch: the limit, not a fork/join cost).
double Time(int threads, int repeats, int64_t per_bag, int num_batches,
            const std::function<void(int, int64_t, int64_t)>& fn) {
  const int iters = std::max<int64_t>(4, 2000000 / (kBags * per_bag));
  auto run = [&](int count) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        for (int it = 0; it < count; ++it) {
          fn(it % num_batches, kBags * t / threads, kBags * (t + 1) / threads);
        }
      });
    }
    for (auto& th : pool) th.join();
  };
  run(iters / 4 + 1);
  std::vector<double> ns;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run(iters);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    ns.push_back(s / iters / (kBags * per_bag) * 1e9);
  }
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(
        stderr,
        "usage: gather_limit ROWS DIM IDS_PER_BAG THREADS HUGE REPEATS\n");
    return 2;
  }
  const int64_t rows = std::atoll(argv[1]), dim = std::atoll(argv[2]);
  const int64_t per_bag = std::atoll(argv[3]);
  const int threads = std::atoi(argv[4]);
  const bool huge = std::atoi(argv[5]) != 0;
  const int repeats = std::atoi(argv[6]);

  using tfce::Storage;
  const int64_t int8_bytes = tfce::RecordBytes(Storage::kInt8Rowwise, dim);
  const int64_t int4_bytes = tfce::RecordBytes(Storage::kInt4Rowwise, dim);
  const int64_t nibble_bytes = (dim + 1) / 2;
  char* rec8 = static_cast<char*>(bench::Table(rows * int8_bytes, huge));
  char* rec4 = static_cast<char*>(bench::Table(rows * int4_bytes, huge));
  char* half = static_cast<char*>(bench::Table(rows * dim * 2, huge));
  char* q = static_cast<char*>(bench::Table(rows * dim, huge));
  char* scales = static_cast<char*>(bench::Table(rows * 4, huge));
  char* fb8 = static_cast<char*>(bench::Table(rows * (dim + 8), huge));
  char* fb4 = static_cast<char*>(bench::Table(rows * (nibble_bytes + 4), huge));
  // Valid values for the kernels (the rest is bytes of 1: int8 ones, nibble
  // pairs 1 and 0): fp16 1.0, int8 scales 1/127 (inline and separate), int4
  // scale 1/15 and bias -0.5 as float16.
  for (int64_t i = 0; i < rows * dim; ++i) {
    reinterpret_cast<uint16_t*>(half)[i] = 0x3c00;
  }
  const float scale8 = 1.0f / 127;
  const uint16_t meta4[2] = {0x2c44, 0xb800};  // float16 1/15, -0.5
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(scales + r * 4, &scale8, 4);
    std::memcpy(rec8 + r * int8_bytes, &scale8, 4);
    std::memcpy(rec4 + r * int4_bytes, meta4, 4);
  }

  const auto batches = bench::IdBatches(rows, per_bag);
  const int num_batches = static_cast<int>(batches.size());
  std::vector<int64_t> offsets(kBags + 1);
  for (int64_t b = 0; b <= kBags; ++b) offsets[b] = b * per_bag;
  std::vector<float> weights(kBags * per_bag, 1.0f);
  std::vector<std::vector<float>> outs(threads,
                                       std::vector<float>(kBags * dim));

  const Layout layouts[] = {
      {"int8", rec8, int8_bytes, int8_bytes, nullptr, true,
       Storage::kInt8Rowwise},
      {"int4", rec4, int4_bytes, int4_bytes, nullptr, true,
       Storage::kInt4Rowwise},
      {"fp16", half, dim * 2, dim * 2, nullptr, true, Storage::kFp16},
      {"int8_split", q, dim, dim, scales, true, Storage::kInt8Split},
      {"fbgemm8", fb8, dim + 8, dim + 8, nullptr, false, Storage::kFp16},
      {"fbgemm4", fb4, nibble_bytes + 4, nibble_bytes + 4, nullptr, false,
       Storage::kFp16},
  };
  std::printf("layout,what,prefetch,ns_per_row,lines_per_row\n");
  std::vector<int64_t> sink(threads);
  for (const Layout& l : layouts) {
    const double lines = LinesPerRow(l, batches[0]);
    // The kernel's own distance for this row size too.
    std::vector<int64_t> distances = {0, 16, 32, 64, 128};
    const int64_t own =
        tfce::PrefetchDistance(l.row_bytes, l.scales != nullptr);
    if (std::find(distances.begin(), distances.end(), own) == distances.end()) {
      distances.push_back(own);
    }
    for (int64_t distance : distances) {
      const double ns = Time(threads, repeats, per_bag, num_batches,
                             [&](int batch, int64_t b0, int64_t b1) {
                               sink[b0 * threads / kBags] +=
                                   Touch(l, batches[batch].data(), b0 * per_bag,
                                         b1 * per_bag, distance);
                             });
      std::printf("%s,touch,%lld,%.3f,%.3f\n", l.name,
                  static_cast<long long>(distance), ns, lines);
    }
    if (!l.kernel) continue;  // FBGEMM's layouts: touched only
    const tfce::KernelVariant& kernels = bench::SelectedVariantOrExit();
    tfce::PoolArgs args{};
    args.table = tfce::TableView{l.storage, l.rows,
                                 reinterpret_cast<const float*>(l.scales),
                                 rows, dim};
    if (tfce::RowBytes(args.table) != l.row_bytes) std::abort();
    args.weights = weights.data();
    args.bag_offsets = offsets.data();
    args.combiner = tfce::Combiner::kSum;
    args.out_stride = dim;
    args.prefetch_rows = tfce::PoolPrefetchRows(args.table, per_bag);
    const double ns = Time(threads, repeats, per_bag, num_batches,
                           [&](int batch, int64_t b0, int64_t b1) {
                             tfce::PoolArgs a = args;
                             a.ids = tfce::IdsView{batches[batch].data(), true};
                             a.bag_begin = b0;
                             a.bag_end = b1;
                             a.out = outs[b0 * threads / kBags].data();
                             if (!kernels.pool(a)) std::abort();
                           });
    std::printf("%s,kernel_%s,%lld,%.3f,%.3f\n", l.name, kernels.name,
                static_cast<long long>(args.prefetch_rows), ns, lines);
  }
  int64_t total = 0;
  for (int64_t s : sink) total += s;
  std::fprintf(stderr, "checksum %lld\n", static_cast<long long>(total));
  return 0;
}
