// AVX2 + FMA + F16C kernels (8 floats per vector). Only this file is built
// with -mavx2 -mfma -mf16c; the dispatch table calls it only on CPUs (and
// OSes) that support all three. Every instruction here is VEX-encoded, and
// the compiler puts vzeroupper at each exit, so there are no AVX/SSE
// transition stalls in the caller.
#include <immintrin.h>

#include <cstdint>

#include "kernels/core/kernel_api.h"
#include "kernels/core/kernel_variants.h"
#include "kernels/core/stage_bytes_inl.h"

namespace tfce {
namespace {

struct Avx2 {
  static constexpr int kLanes = 8;
  using Vec = __m256;

  static Vec Zero() { return _mm256_setzero_ps(); }
  static Vec Set1(float x) { return _mm256_set1_ps(x); }
  static Vec MulAdd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec Add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec Mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec Div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
  static void Store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  // Always inlined: out of line, GCC sees no effect and deletes its calls.
  __attribute__((always_inline)) static void Prefetch(const void* p) {
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
  }

  // One 8-byte load, widened in registers.
  static Vec LoadInt8(const int8_t* p) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  }
  static Vec LoadHalf(const uint16_t* p) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }

  // Eight 4-bit values from the low 32 bits of `bytes`: the nibbles are
  // split and interleaved with byte operations, then widened.
  static Vec NibblesToFloat(uint32_t bytes) {
    const __m128i b = _mm_cvtsi32_si128(static_cast<int>(bytes));
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128i q = _mm_unpacklo_epi8(
        _mm_and_si128(b, low), _mm_and_si128(_mm_srli_epi16(b, 4), low));
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
  }
  static Vec LoadNibbles(const uint8_t* p) {
    uint32_t four;
    __builtin_memcpy(&four, p, 4);
    return NibblesToFloat(four);
  }
  // Sixteen 4-bit values from 8 bytes, widened once: the even elements are
  // the low nibbles, the odd ones the high nibbles.
  static void LoadNibbleHalves(const uint8_t* p, Vec* even, Vec* odd) {
    const __m256i b = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    *even = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(0x0F)));
    *odd = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
  }
  static void Interleave(Vec even, Vec odd, Vec* first, Vec* second) {
    const __m256 low = _mm256_unpacklo_ps(even, odd);   // 0-3 | 8-11
    const __m256 high = _mm256_unpackhi_ps(even, odd);  // 4-7 | 12-15
    *first = _mm256_permute2f128_ps(low, high, 0x20);
    *second = _mm256_permute2f128_ps(low, high, 0x31);
  }
  static void HalfPair(const void* p, float* first, float* second) {
    uint32_t bits;
    __builtin_memcpy(&bits, p, 4);
    const __m128 v = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(bits)));
    *first = _mm_cvtss_f32(v);
    *second = _mm_cvtss_f32(_mm_shuffle_ps(v, v, 1));
  }

  // Tails (n < 8): the first four elements with one exact narrower load
  // (dim 12 = 8 + 4 needs nothing else), the last n % 4 staged through a
  // register, so nothing past the row is read.
  static Vec LoadInt8Tail(const int8_t* p, int n) {
    uint64_t bytes;
    if (n >= 4) {
      uint32_t four;
      __builtin_memcpy(&four, p, 4);
      bytes = four | (StageBytes(p + 4, n - 4) << 32);
    } else {
      bytes = StageBytes(p, n);
    }
    const __m128i q = _mm_cvtsi64_si128(static_cast<long long>(bytes));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  }
  static Vec LoadNibblesTail(const uint8_t* p, int n) {
    return NibblesToFloat(static_cast<uint32_t>(StageBytes(p, (n + 1) / 2)));
  }
  static Vec LoadHalfTail(const uint16_t* p, int n) {
    __m128i h;
    if (n >= 4) {
      const __m128i four = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
      h = _mm_insert_epi64(
          four, static_cast<long long>(StageBytes(p + 4, 2 * (n - 4))), 1);
    } else {
      h = _mm_cvtsi64_si128(static_cast<long long>(StageBytes(p, 2 * n)));
    }
    return _mm256_cvtph_ps(h);
  }
  static void StoreTail(float* p, Vec v, int n) {
    __m128 part = _mm256_castps256_ps128(v);
    if (n >= 4) {
      _mm_storeu_ps(p, part);
      part = _mm256_extractf128_ps(v, 1);
      p += 4;
      n -= 4;
    }
    if (n > 0) {
      const __m128i mask =
          _mm_cmpgt_epi32(_mm_set1_epi32(n), _mm_setr_epi32(0, 1, 2, 3));
      _mm_maskstore_ps(p, mask, part);
    }
  }
};

}  // namespace
}  // namespace tfce

#include "kernels/core/simd_kernels_inl.h"

TFCE_DEFINE_SIMD_KERNEL_VARIANT(avx2, Avx2)
