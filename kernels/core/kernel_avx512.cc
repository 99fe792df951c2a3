// AVX-512 (F, BW, VL) kernels, 16 floats per vector. Only this file is built
// with AVX-512 flags; the dispatch table calls it only on CPUs and OSes that
// support AVX-512 F/BW/VL (and AVX2/FMA/F16C, which the compiler may also
// use here). Tail loads read exactly the row's remaining bytes, with 8- and
// 4-byte loads and a staged rest: a masked 16-byte load whose masked-off
// bytes fall in the next cache line waits for that line (never prefetched:
// it is not the row's) on AMD Zen, a full miss for rows beyond the cache
// (benchmarks/record_layout.py measures it). Tail stores
// are one masked store: the output is written sequentially.
#include <immintrin.h>

#include <cstdint>

#include "kernels/core/kernel_api.h"
#include "kernels/core/kernel_variants.h"
#include "kernels/core/stage_bytes_inl.h"

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

  // Sixteen 4-bit values from 8 bytes: the nibbles are split and
  // interleaved with byte operations, then widened.
  static Vec NibblesToFloat(__m128i b) {
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128i q = _mm_unpacklo_epi8(
        _mm_and_si128(b, low), _mm_and_si128(_mm_srli_epi16(b, 4), low));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q));
  }
  static Vec LoadNibbles(const uint8_t* p) {
    return NibblesToFloat(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  // Thirty-two 4-bit values from 16 bytes, widened once: the even elements
  // are the low nibbles, the odd ones the high nibbles.
  static void LoadNibbleHalves(const uint8_t* p, Vec* even, Vec* odd) {
    const __m512i b = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    *even = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(0x0F)));
    *odd = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
  }
  static void Interleave(Vec even, Vec odd, Vec* first, Vec* second) {
    const __m512i low = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5,
                                          21, 6, 22, 7, 23);
    const __m512i high = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28,
                                           13, 29, 14, 30, 15, 31);
    *first = _mm512_permutex2var_ps(even, low, odd);
    *second = _mm512_permutex2var_ps(even, high, odd);
  }
  static void HalfPair(const void* p, float* first, float* second) {
    uint32_t bits;
    __builtin_memcpy(&bits, p, 4);
    const __m128 v = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(bits)));
    *first = _mm_cvtss_f32(v);
    *second = _mm_cvtss_f32(_mm_shuffle_ps(v, v, 1));
  }

  static __mmask16 Mask(int n) { return static_cast<__mmask16>((1u << n) - 1); }
  // Up to 16 bytes at p, exactly `bytes` of them read, zero-extended.
  static __m128i LoadBytes(const void* p, int bytes) {
    const char* b = static_cast<const char*>(p);
    uint64_t low = 0, high = 0;
    if (bytes >= 8) {
      __builtin_memcpy(&low, b, 8);
      b += 8;
      bytes -= 8;
      high = TailWord(b, bytes);
    } else {
      low = TailWord(b, bytes);
    }
    return _mm_set_epi64x(static_cast<long long>(high),
                          static_cast<long long>(low));
  }
  // Up to 8 bytes: one 4-byte load when there are 4 or more, the rest
  // staged.
  static uint64_t TailWord(const char* b, int bytes) {
    if (bytes < 4) return StageBytes(b, bytes);
    uint32_t four;
    __builtin_memcpy(&four, b, 4);
    return four | (StageBytes(b + 4, bytes - 4) << 32);
  }
  static Vec LoadInt8Tail(const int8_t* p, int n) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(LoadBytes(p, n)));
  }
  static Vec LoadNibblesTail(const uint8_t* p, int n) {
    return NibblesToFloat(LoadBytes(p, (n + 1) / 2));
  }
  static Vec LoadHalfTail(const uint16_t* p, int n) {
    __m256i h;
    if (n >= 8) {
      const __m128i low = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      h = _mm256_inserti128_si256(_mm256_castsi128_si256(low),
                                  LoadBytes(p + 8, 2 * (n - 8)), 1);
    } else {
      h = _mm256_zextsi128_si256(LoadBytes(p, 2 * n));
    }
    return _mm512_cvtph_ps(h);
  }
  static void StoreTail(float* p, Vec v, int n) {
    _mm512_mask_storeu_ps(p, Mask(n), v);
  }
};

}  // namespace
}  // namespace tfce

#include "kernels/core/simd_kernels_inl.h"

TFCE_DEFINE_SIMD_KERNEL_VARIANT(avx512, Avx512)
