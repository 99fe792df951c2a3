// Test tables, sentinel-padded outputs and the pooled error bound shared by
// the TF-free kernel tests.
#ifndef TFCE_TESTS_CC_KERNEL_TEST_UTIL_H_
#define TFCE_TESTS_CC_KERNEL_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/core/kernel_api.h"

namespace tfce {
namespace testing {

constexpr float kSentinel = -12345.5f;
constexpr int kPad = 16;  // sentinel floats before and after each output

inline uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// NaNs must stay NaN (with their sign); everything else bit-identical.
inline bool SameFloat(float got, float want) {
  return std::isnan(want)
             ? std::isnan(got) && std::signbit(got) == std::signbit(want)
             : Bits(got) == Bits(want);
}

inline const char* StorageName(Storage storage) {
  return storage == Storage::kInt8Split ? "int8" : "fp16";
}

// The largest error a pooled float32 result may have against the exact
// (double) result: each of the `terms` products within two roundings, each
// add, the final add of two partial sums and the divide one rounding each,
// relative to `magnitude`, the sum of the terms' absolute values.
// An empty or zero-denominator bag must be exactly 0. The same bound as
// pooled_error_bound in tf_compressed_embedding/quantization.py, where it is
// derived; this is its one C++ home.
inline double PooledFloat32ErrorBound(int64_t terms, double magnitude,
                                      double denom) {
  if (denom == 0) return 0;
  return (2 * terms + 4) * 1.1920929e-7 * magnitude / std::fabs(denom) + 1e-30;
}

struct Table {
  Storage storage;
  int64_t rows, dim;
  // One spare element in front, so rows start off any vector alignment
  // (tables sliced from bigger tensors do).
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  std::vector<double> decoded;  // independent double-precision decode

  size_t elem() const { return storage == Storage::kInt8Split ? 1 : 2; }
  const void* data() const { return bytes.data() + elem(); }
  TableView View() const {
    return TableView{storage, data(),
                     storage == Storage::kInt8Split ? scales.data() : nullptr, rows,
                     dim};
  }
};

inline Table MakeTable(Storage storage, int64_t rows, int64_t dim,
                       std::mt19937* rng) {
  Table t{storage, rows, dim, {}, {}, {}};
  t.bytes.assign((1 + rows * dim) * t.elem(), 0);
  t.decoded.resize(rows * dim);
  std::uniform_int_distribution<int> q(-127, 127);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  if (storage == Storage::kInt8Split) {
    t.scales.resize(rows);
    for (int64_t r = 0; r < rows; ++r) {
      t.scales[r] = std::fabs(normal(*rng)) / 127;
    }
  }
  for (int64_t i = 0; i < rows * dim; ++i) {
    if (storage == Storage::kInt8Split) {
      const int8_t v = static_cast<int8_t>(q(*rng));
      std::memcpy(&t.bytes[1 + i], &v, 1);  // after the spare byte
      // The product of an int8 and a float is exact in double and rounds
      // once to float: the reference decode is that rounding.
      t.decoded[i] = static_cast<float>(static_cast<double>(v) *
                                        static_cast<double>(t.scales[i / dim]));
    } else {
      const _Float16 h = static_cast<_Float16>(normal(*rng));
      std::memcpy(&t.bytes[2 + 2 * i], &h, 2);
      t.decoded[i] = static_cast<double>(static_cast<float>(h));
    }
  }
  return t;
}

// Output with kPad sentinels on each side; out() is a deliberately
// unaligned interior pointer (offset by one float).
struct Padded {
  std::vector<float> buf;
  explicit Padded(int64_t n) : buf(n + 2 * kPad + 2, kSentinel) {}
  float* out() { return buf.data() + kPad + 1; }
  bool PadsIntact() const {
    for (int i = 0; i < kPad + 1; ++i) {
      if (buf[i] != kSentinel || buf[buf.size() - 1 - i] != kSentinel) {
        return false;
      }
    }
    return true;
  }
};

}  // namespace testing
}  // namespace tfce

#endif  // TFCE_TESTS_CC_KERNEL_TEST_UTIL_H_
