// Table memory and id batches shared by the C++ benchmarks (no TensorFlow).
#ifndef TFCE_BENCHMARKS_BENCH_MEMORY_H_
#define TFCE_BENCHMARKS_BENCH_MEMORY_H_

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace bench {

constexpr int64_t kBags = 512;  // bags per batch, as in the op benchmark
constexpr size_t kHugePage = size_t{2} << 20;

// Anonymous memory on 4 KiB pages, or collapsed to 2 MiB pages like the ops
// do for TF's tensors (kernels/huge_pages.cc). Filled with bytes of 1.
inline void* Table(size_t bytes, bool huge) {
  bytes = (bytes + kHugePage - 1) & ~(kHugePage - 1);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();
  madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  std::memset(p, 1, bytes);
  if (huge) madvise(p, bytes, 25);  // MADV_COLLAPSE
  return p;
}

// Rotating batches of kBags * per_bag uniform ids (~1M ids in all), so
// consecutive calls do not reuse rows.
inline std::vector<std::vector<int64_t>> IdBatches(int64_t rows,
                                                   int64_t per_bag) {
  std::mt19937_64 rng(7);
  const int num_batches =
      static_cast<int>(std::max<int64_t>(2, 1000000 / (kBags * per_bag)));
  std::vector<std::vector<int64_t>> batches(num_batches);
  for (auto& b : batches) {
    b.resize(kBags * per_bag);
    for (auto& id : b) id = static_cast<int64_t>(rng() % rows);
  }
  return batches;
}

}  // namespace bench

#endif  // TFCE_BENCHMARKS_BENCH_MEMORY_H_
