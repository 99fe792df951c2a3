// Staging of a row's last few bytes into a register, for ISAs without
// masked loads (SSE4.1, AVX2). Included by those ISA files only, inside
// their anonymous namespace context, so each gets its own copy compiled with
// its own flags.
#ifndef TFCE_KERNELS_CORE_STAGE_BYTES_INL_H_
#define TFCE_KERNELS_CORE_STAGE_BYTES_INL_H_

#include <cstdint>

namespace tfce {
namespace {

// Up to 8 bytes into a register, little-endian; nothing past them is read.
// A constant `bytes` folds to plain loads, a run-time one stays a short loop
// (no libc call).
inline uint64_t StageBytes(const void* p, int bytes) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  uint64_t v = 0;
  for (int j = 0; j < bytes; ++j) v |= static_cast<uint64_t>(b[j]) << (8 * j);
  return v;
}

}  // namespace
}  // namespace tfce

#endif  // TFCE_KERNELS_CORE_STAGE_BYTES_INL_H_
