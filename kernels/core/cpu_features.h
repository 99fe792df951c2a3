// What this CPU and OS can execute, read once from CPUID and XCR0.
#ifndef TFCE_KERNELS_CORE_CPU_FEATURES_H_
#define TFCE_KERNELS_CORE_CPU_FEATURES_H_

#include <cstdint>

namespace tfce {

struct CpuFeatures {
  bool sse41 = false;
  bool avx2 = false;  // AVX2 and the OS saves YMM state
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;  // AVX-512 F and the OS saves ZMM/opmask state
  bool avx512bw = false;
  bool avx512vl = false;
  // One core's L2 data cache, from the OS (CPUID leaf 4 through glibc);
  // kDefaultL2CacheBytes when it does not say.
  int64_t l2_cache_bytes = 0;
};

constexpr int64_t kDefaultL2CacheBytes = int64_t{1} << 21;  // 2 MiB

// Detected once; safe to call from any thread.
const CpuFeatures& GetCpuFeatures();

}  // namespace tfce

#endif  // TFCE_KERNELS_CORE_CPU_FEATURES_H_
