// Table memory, id batches and the kernel variant, shared by the C++
// benchmarks (no TensorFlow).
#ifndef TFCE_BENCHMARKS_BENCH_MEMORY_H_
#define TFCE_BENCHMARKS_BENCH_MEMORY_H_

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/core/dispatch.h"
#include "kernels/tf/huge_pages.h"  // TF-free: the page size, MADV_COLLAPSE

namespace bench {

constexpr int64_t kBags = 512;  // bags per batch, as in the op benchmark

// Anonymous memory on 4 KiB pages, or collapsed to 2 MiB pages like the ops
// do for TF's tensors (kernels/tf/huge_pages.cc). Filled with bytes of 1.
inline void* Table(size_t bytes, bool huge) {
  constexpr size_t kPage = tfce::kHugePageBytes;
  bytes = (bytes + kPage - 1) & ~(kPage - 1);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();
  madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  std::memset(p, 1, bytes);
  if (huge) madvise(p, bytes, tfce::kMadvCollapse);
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

// The kernel variant the ops would run (TFCE_ISA, or the CPU's best); exits
// with the reason when TFCE_ISA cannot be honoured.
inline const tfce::KernelVariant& SelectedVariantOrExit() {
  std::string error;
  const tfce::KernelVariant* variant = tfce::SelectedVariant(&error);
  if (variant == nullptr) {
    std::fprintf(stderr, "%s\n", error.c_str());
    std::exit(1);
  }
  return *variant;
}

}  // namespace bench

#endif  // TFCE_BENCHMARKS_BENCH_MEMORY_H_
