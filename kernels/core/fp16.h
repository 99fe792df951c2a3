// Exact IEEE binary16 -> binary32 conversion with integer operations only,
// so the reference kernel needs no F16C and gives the same bits everywhere.
#ifndef TFCE_KERNELS_CORE_FP16_H_
#define TFCE_KERNELS_CORE_FP16_H_

#include <cstdint>
#include <cstring>

namespace tfce {

inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1Fu) {  // Inf or NaN: keep the payload
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal: re-bias 15 -> 127
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // signed zero
    bits = sign;
  } else {  // subnormal half is a normal float: shift the leading 1 up
    int32_t e = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits =
        sign | (static_cast<uint32_t>(e) << 23) | ((mantissa & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace tfce

#endif  // TFCE_KERNELS_CORE_FP16_H_
