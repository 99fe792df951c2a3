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

#include "kernels/core/dispatch.h"
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
  switch (storage) {
    case Storage::kInt8Split:
      return "int8_split";
    case Storage::kFp16:
      return "fp16";
    case Storage::kInt8Rowwise:
      return "int8_rowwise";
    case Storage::kInt4Rowwise:
      return "int4_rowwise";
  }
  return "unknown_storage";
}

// Every storage format, for the tests' parameter lists.
inline std::vector<Storage> AllStorages() {
  return {Storage::kInt8Split, Storage::kFp16, Storage::kInt8Rowwise,
          Storage::kInt4Rowwise};
}

// Bytes of one stored row of `dim` values, from the format definitions
// (tf_compressed_embedding/quantization.py), not from kernel_api.h's
// RecordBytes: the tables below are laid out by these.
inline int64_t TestRowBytes(Storage storage, int64_t dim) {
  switch (storage) {
    case Storage::kInt8Split:
      return dim;  // the scale is in its own array
    case Storage::kFp16:
      return 2 * dim;
    case Storage::kInt8Rowwise:
      return 4 + dim;  // [float32 scale][dim x int8]
    case Storage::kInt4Rowwise:
      return 4 + (dim + 1) / 2;  // [f16 scale][f16 bias][nibbles]
  }
  return 0;
}

// The largest error a pooled float32 result may have against the exact
// (double) result: each of the `terms` products within two roundings, each
// add, the final add of two partial sums and the divide one rounding each,
// relative to `magnitude`, the sum of the terms' absolute values (for int4,
// sum |w| (|q scale| + |bias|): the kernels add a row's weighted values and
// its weighted bias separately, see Table::magnitude).
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
  // Spare bytes in front, so rows start off any vector alignment (tables
  // sliced from bigger tensors do): one element of the plain formats, one
  // byte of the rowwise ones (whose records have any stride, so their
  // scales are unaligned too).
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  std::vector<double> decoded;  // independent double-precision decode
  // Per element, for a weight of 1: the magnitude of the terms the kernels
  // accumulate: |decoded|, or |q scale| + |bias| for int4.
  std::vector<double> magnitude;

  size_t spare() const { return storage == Storage::kFp16 ? 2 : 1; }
  int64_t row_bytes() const { return TestRowBytes(storage, dim); }
  const void* data() const { return bytes.data() + spare(); }
  uint8_t* record(int64_t row) {
    return bytes.data() + spare() + row * row_bytes();
  }
  TableView View() const {
    return TableView{storage, data(),
                     storage == Storage::kInt8Split ? scales.data() : nullptr,
                     rows, dim};
  }
};

inline uint16_t HalfBits(_Float16 h) {
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

// A table of random stored values, scales and biases (not an encoder's
// output: every stored value the format allows, decoded as given), with
// the decode worked out independently in double: products of an int8 or a
// nibble and a float or half are exact in double, and so is the int4 sum
// float(q scale) + bias (both multiples of 2^-24 below 2^21), so one
// conversion to float gives the float32 result of each rounding.
inline Table MakeTable(Storage storage, int64_t rows, int64_t dim,
                       std::mt19937* rng) {
  Table t{storage, rows, dim, {}, {}, {}, {}};
  t.bytes.assign(t.spare() + rows * t.row_bytes(), 0);
  t.decoded.resize(rows * dim);
  t.magnitude.resize(rows * dim);
  std::uniform_int_distribution<int> int8_value(-128, 127);
  std::uniform_int_distribution<int> nibble(0, 15);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* record = t.record(r);
    switch (storage) {
      case Storage::kInt8Split:
      case Storage::kInt8Rowwise: {
        const float scale = std::fabs(normal(*rng)) / 127;
        if (storage == Storage::kInt8Split) {
          t.scales.push_back(scale);
        } else {
          std::memcpy(record, &scale, 4);  // little-endian, as x86 stores
        }
        int8_t* values = reinterpret_cast<int8_t*>(
            storage == Storage::kInt8Split ? record : record + 4);
        for (int64_t d = 0; d < dim; ++d) {
          const int8_t v = static_cast<int8_t>(int8_value(*rng));
          values[d] = v;
          t.decoded[r * dim + d] = static_cast<float>(
              static_cast<double>(v) * static_cast<double>(scale));
        }
        break;
      }
      case Storage::kFp16:
        for (int64_t d = 0; d < dim; ++d) {
          const _Float16 h = static_cast<_Float16>(normal(*rng));
          std::memcpy(record + 2 * d, &h, 2);
          t.decoded[r * dim + d] = static_cast<double>(static_cast<float>(h));
        }
        break;
      case Storage::kInt4Rowwise: {
        // Scales of either sign (used as given), some biases of the
        // values' size and some far larger (a row's offset).
        const _Float16 scale = static_cast<_Float16>(normal(*rng) / 8);
        const _Float16 bias =
            static_cast<_Float16>(normal(*rng) * (r % 3 == 0 ? 100.0f : 1.0f));
        const uint16_t scale_bits = HalfBits(scale), bias_bits = HalfBits(bias);
        std::memcpy(record, &scale_bits, 2);
        std::memcpy(record + 2, &bias_bits, 2);
        const double s = static_cast<float>(scale),
                     b = static_cast<float>(bias);
        for (int64_t d = 0; d < dim; ++d) {
          const int q = nibble(*rng);
          // Element d: the low nibble of byte d / 2 if d is even, else the
          // high one.
          record[4 + d / 2] |= static_cast<uint8_t>(d % 2 == 0 ? q : q << 4);
          const float product = static_cast<float>(q * s);
          t.decoded[r * dim + d] =
              static_cast<float>(static_cast<double>(product) + b);
          t.magnitude[r * dim + d] = std::fabs(q * s) + std::fabs(b);
        }
        // An odd dim's last high nibble is 0 in the format; junk here must
        // not reach any output.
        if (dim % 2 == 1) record[4 + dim / 2] |= 0xA0;
        break;
      }
    }
  }
  if (storage != Storage::kInt4Rowwise) {
    for (size_t i = 0; i < t.decoded.size(); ++i) {
      t.magnitude[i] = std::fabs(t.decoded[i]);
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

// Indices into KernelVariants(), so test names stay readable.
inline std::vector<int> AllVariants() {
  int n = 0;
  KernelVariants(&n);
  std::vector<int> all(n);
  for (int i = 0; i < n; ++i) all[i] = i;
  return all;
}

inline const KernelVariant& VariantAt(int index) {
  int n = 0;
  return KernelVariants(&n)[index];
}

// Selects `index` for the test's lifetime, or skips a variant this CPU
// cannot run.
#define TFCE_SELECT_VARIANT_OR_SKIP(index)                        \
  const KernelVariant& variant_under_test = VariantAt(index);     \
  if (!variant_under_test.cpu_can_run()) {                        \
    GTEST_SKIP() << "kernel variant " << variant_under_test.name  \
                 << ": this CPU cannot run it (not tested here)"; \
  }                                                               \
  ScopedVariantOverride selected(&variant_under_test);            \
  const KernelVariant& variant = *SelectedVariant(nullptr);       \
  ASSERT_EQ(&variant, &variant_under_test)

}  // namespace testing
}  // namespace tfce

#endif  // TFCE_TESTS_CC_KERNEL_TEST_UTIL_H_
