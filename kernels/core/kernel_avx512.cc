// AVX-512 (F, BW, VL) kernels, 16 floats per vector. Only this file is built
// with AVX-512 flags; the dispatch table calls it only on CPUs and OSes that
// support AVX-512 F/BW/VL (and AVX2/FMA/F16C, which the compiler may also
// use here). Tails of any length are one masked load or store: masked-off
// lanes are neither read nor written, and never fault.
#include <immintrin.h>

#include <cstdint>

#include "kernels/core/kernel_api.h"
#include "kernels/core/kernel_variants.h"

namespace tfce {
namespace {

struct Avx512 {
  static constexpr int kLanes = 16;
  using Vec = __m512;

  static Vec Zero() { return _mm512_setzero_ps(); }
  static Vec Set1(float x) { return _mm512_set1_ps(x); }
  static Vec MulAdd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec Add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec Mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec Div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
  static void Store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  // Always inlined: out of line, GCC sees no effect and deletes its calls.
  __attribute__((always_inline)) static void Prefetch(const void* p) {
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
  }

  static Vec LoadInt8(const int8_t* p) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
  }
  static Vec LoadHalf(const uint16_t* p) {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }

  static __mmask16 Mask(int n) { return static_cast<__mmask16>((1u << n) - 1); }
  static Vec LoadInt8Tail(const int8_t* p, int n) {
    const __m128i q = _mm_maskz_loadu_epi8(Mask(n), p);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
  }
  static Vec LoadHalfTail(const uint16_t* p, int n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(Mask(n), p));
  }
  static void StoreTail(float* p, Vec v, int n) {
    _mm512_mask_storeu_ps(p, Mask(n), v);
  }
};

}  // namespace
}  // namespace tfce

#include "kernels/core/simd_kernels_inl.h"

TFCE_DEFINE_SIMD_KERNEL_VARIANT(avx512, Avx512)
