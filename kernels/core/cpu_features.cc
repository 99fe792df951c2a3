#include "kernels/core/cpu_features.h"

#include <unistd.h>

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace tfce {
namespace {

#if defined(__x86_64__) || defined(__i386__)
// XCR0 says which register state the OS saves on context switch; CPUID alone
// is not enough (a CPU with AVX under an OS that does not save YMM faults).
uint64_t ReadXcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned int eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  f.sse41 = (ecx & bit_SSE4_1) != 0;
  const bool osxsave = (ecx & bit_OSXSAVE) != 0;
  const bool avx = (ecx & bit_AVX) != 0;
  const bool fma = (ecx & bit_FMA) != 0;
  const bool f16c = (ecx & bit_F16C) != 0;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool ymm_saved = (xcr0 & 0x6) == 0x6;  // SSE + AVX state
  const bool zmm_saved =
      (xcr0 & 0xE6) == 0xE6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!ymm_saved) return f;
  f.fma = fma;
  f.f16c = f16c;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    f.avx2 = (ebx & bit_AVX2) != 0;
    if (zmm_saved) {
      f.avx512f = (ebx & bit_AVX512F) != 0;
      f.avx512bw = (ebx & bit_AVX512BW) != 0;
      f.avx512vl = (ebx & bit_AVX512VL) != 0;
    }
  }
  return f;
}
#else
CpuFeatures Detect() { return CpuFeatures(); }
#endif

int64_t L2CacheBytes() {
#ifdef _SC_LEVEL2_CACHE_SIZE
  const long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (bytes > 0) return bytes;
#endif
  return kDefaultL2CacheBytes;
}

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = [] {
    CpuFeatures f = Detect();
    f.l2_cache_bytes = L2CacheBytes();
    return f;
  }();
  return features;
}

}  // namespace tfce
