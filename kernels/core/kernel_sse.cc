// The "sse" kernel variant: SSE4.1 (4 floats per vector). Only this file is
// built with -msse4.1. SSE4.1 CPUs may lack FMA and F16C, so this file uses a
// multiply then an add, and decodes float16 with integer operations (exact, and
// independent of the denormals-are-zero mode TensorFlow sets).
#include <smmintrin.h>

#include <cstdint>

#include "kernels/core/kernel_api.h"
#include "kernels/core/kernel_variants.h"
#include "kernels/core/stage_bytes_inl.h"

namespace tfce {
namespace {

struct Sse {
  static constexpr int kLanes = 4;
  using Vec = __m128;

  static Vec Zero() { return _mm_setzero_ps(); }
  static Vec Set1(float x) { return _mm_set1_ps(x); }
  static Vec MulAdd(Vec a, Vec b, Vec c) {
    return _mm_add_ps(_mm_mul_ps(a, b), c);
  }
  static Vec Add(Vec a, Vec b) { return _mm_add_ps(a, b); }
  static Vec Mul(Vec a, Vec b) { return _mm_mul_ps(a, b); }
  static Vec Div(Vec a, Vec b) { return _mm_div_ps(a, b); }
  static void Store(float* p, Vec v) { _mm_storeu_ps(p, v); }
  // Always inlined: out of line, GCC sees no effect and deletes its calls.
  __attribute__((always_inline)) static void Prefetch(const void* p) {
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
  }

  static Vec Int8ToFloat(uint32_t four_bytes) {
    const __m128i q = _mm_cvtsi32_si128(static_cast<int>(four_bytes));
    return _mm_cvtepi32_ps(_mm_cvtepi8_epi32(q));
  }
  // Four halves (zero-extended to 32 bits) to floats, bit-exact:
  //   normal:    exponent re-biased by 127 - 15 = 112
  //   Inf/NaN:   exponent 31 -> 255, payload kept
  //   subnormal: mantissa * 2^-24, computed from an exact integer (no
  //              float denormal appears, so DAZ/FTZ cannot change it)
  static Vec HalvesToFloat(__m128i h) {
    const __m128i sign =
        _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x8000)), 16);
    const __m128i em = _mm_and_si128(h, _mm_set1_epi32(0x7FFF));
    const __m128i normal =
        _mm_add_epi32(_mm_slli_epi32(em, 13), _mm_set1_epi32(112 << 23));
    const __m128i inf_nan = _mm_add_epi32(normal, _mm_set1_epi32(112 << 23));
    const __m128i subnormal = _mm_castps_si128(
        _mm_mul_ps(_mm_cvtepi32_ps(em), _mm_set1_ps(1.0f / 16777216.0f)));
    const __m128i is_sub = _mm_cmplt_epi32(em, _mm_set1_epi32(0x0400));
    const __m128i is_inf_nan = _mm_cmpgt_epi32(em, _mm_set1_epi32(0x7BFF));
    __m128i bits = _mm_blendv_epi8(normal, subnormal, is_sub);
    bits = _mm_blendv_epi8(bits, inf_nan, is_inf_nan);
    return _mm_castsi128_ps(_mm_or_si128(bits, sign));
  }

  static Vec LoadInt8(const int8_t* p) {
    uint32_t four;
    __builtin_memcpy(&four, p, 4);
    return Int8ToFloat(four);
  }
  static Vec LoadHalf(const uint16_t* p) {
    return HalvesToFloat(_mm_cvtepu16_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }

  // Four 4-bit values from the low 16 bits of `bytes`: the nibbles are
  // split and interleaved with byte operations, then widened.
  static Vec NibblesToFloat(uint32_t bytes) {
    const __m128i b = _mm_cvtsi32_si128(static_cast<int>(bytes));
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128i q = _mm_unpacklo_epi8(
        _mm_and_si128(b, low), _mm_and_si128(_mm_srli_epi16(b, 4), low));
    return _mm_cvtepi32_ps(_mm_cvtepu8_epi32(q));
  }
  static Vec LoadNibbles(const uint8_t* p) {
    uint16_t two;
    __builtin_memcpy(&two, p, 2);
    return NibblesToFloat(two);
  }
  // Eight 4-bit values from 4 bytes, widened once: the even elements are
  // the low nibbles, the odd ones the high nibbles.
  static void LoadNibbleHalves(const uint8_t* p, Vec* even, Vec* odd) {
    uint32_t four;
    __builtin_memcpy(&four, p, 4);
    const __m128i b =
        _mm_cvtepu8_epi32(_mm_cvtsi32_si128(static_cast<int>(four)));
    *even = _mm_cvtepi32_ps(_mm_and_si128(b, _mm_set1_epi32(0x0F)));
    *odd = _mm_cvtepi32_ps(_mm_srli_epi32(b, 4));
  }
  static void Interleave(Vec even, Vec odd, Vec* first, Vec* second) {
    *first = _mm_unpacklo_ps(even, odd);
    *second = _mm_unpackhi_ps(even, odd);
  }
  static void HalfPair(const void* p, float* first, float* second) {
    uint32_t bits;
    __builtin_memcpy(&bits, p, 4);
    const Vec v = HalvesToFloat(
        _mm_cvtepu16_epi32(_mm_cvtsi32_si128(static_cast<int>(bits))));
    *first = _mm_cvtss_f32(v);
    *second = _mm_cvtss_f32(_mm_shuffle_ps(v, v, 1));
  }

  // Tails (n < 4): staged through a register, nothing past the row is read.
  static Vec LoadInt8Tail(const int8_t* p, int n) {
    return Int8ToFloat(static_cast<uint32_t>(StageBytes(p, n)));
  }
  static Vec LoadNibblesTail(const uint8_t* p, int n) {
    return NibblesToFloat(static_cast<uint32_t>(StageBytes(p, (n + 1) / 2)));
  }
  static Vec LoadHalfTail(const uint16_t* p, int n) {
    return HalvesToFloat(_mm_cvtepu16_epi32(
        _mm_cvtsi64_si128(static_cast<long long>(StageBytes(p, 2 * n)))));
  }
  static void StoreTail(float* p, Vec v, int n) {
    if (n >= 2) {
      _mm_storel_pi(reinterpret_cast<__m64*>(p), v);
      v = _mm_movehl_ps(v, v);
      p += 2;
      n -= 2;
    }
    if (n > 0) _mm_store_ss(p, v);
  }
};

}  // namespace
}  // namespace tfce

#include "kernels/core/simd_kernels_inl.h"

TFCE_DEFINE_SIMD_KERNEL_VARIANT(sse, Sse)
