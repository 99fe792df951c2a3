// What this CPU and OS can execute, read once from CPUID and XCR0.
#ifndef TFCE_KERNELS_CPU_FEATURES_H_
#define TFCE_KERNELS_CPU_FEATURES_H_

namespace tfce {

struct CpuFeatures {
  bool sse41 = false;
  bool avx2 = false;  // AVX2 and the OS saves YMM state
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;  // AVX-512 F and the OS saves ZMM/opmask state
  bool avx512bw = false;
  bool avx512vl = false;
};

// Detected once; safe to call from any thread.
const CpuFeatures& GetCpuFeatures();

}  // namespace tfce

#endif  // TFCE_KERNELS_CPU_FEATURES_H_
