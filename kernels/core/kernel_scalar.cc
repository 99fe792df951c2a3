// The "scalar" kernel variant, the reference: the specification of
// kernel_api.h, the oracle every ISA kernel is tested against, and the
// fallback on any CPU.
// Built with no ISA flags and -ffp-contract=off, so its rounding is exactly
// "multiply, then add" on every compiler and CPU.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/core/fp16.h"
#include "kernels/core/kernel_api.h"
#include "kernels/core/kernel_variants.h"

namespace tfce {
namespace scalar {
namespace {

// One unsigned compare covers both id < 0 and id >= rows.
inline bool InRange(int64_t id, int64_t rows) {
  return static_cast<uint64_t>(id) < static_cast<uint64_t>(rows);
}

// A row decodes as Value(d) * Scale() (+ Bias() where kHasBias): the
// stored value times the row's scale (1 for fp16, where the multiply is
// exact), plus the row's bias.
struct Int8SplitRow {
  static constexpr bool kHasBias = false;
  static float Value(const TableView& t, int64_t row, int64_t d) {
    return static_cast<float>(
        static_cast<const int8_t*>(t.data)[row * t.dim + d]);
  }
  static float Scale(const TableView& t, int64_t row) { return t.scales[row]; }
  static float Bias(const TableView&, int64_t) { return 0.0f; }
};

struct Fp16Row {
  static constexpr bool kHasBias = false;
  static float Value(const TableView& t, int64_t row, int64_t d) {
    const char* h = static_cast<const char*>(t.data) + 2 * (row * t.dim + d);
    uint16_t bits;
    std::memcpy(&bits, h, 2);  // no alignment assumed
    return HalfBitsToFloat(bits);
  }
  static float Scale(const TableView&, int64_t) { return 1.0f; }
  static float Bias(const TableView&, int64_t) { return 0.0f; }
};

// The start of row `row`'s record in a rowwise table.
inline const unsigned char* Record(const TableView& t, int64_t row) {
  return static_cast<const unsigned char*>(t.data) +
         row * RecordBytes(t.storage, t.dim);
}

inline float HalfAt(const unsigned char* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return HalfBitsToFloat(bits);
}

struct Int8RowwiseRow {
  static constexpr bool kHasBias = false;
  static float Value(const TableView& t, int64_t row, int64_t d) {
    return static_cast<float>(
        static_cast<int8_t>(Record(t, row)[kRecordHeaderBytes + d]));
  }
  static float Scale(const TableView& t, int64_t row) {
    float scale;
    std::memcpy(&scale, Record(t, row), 4);
    return scale;
  }
  static float Bias(const TableView&, int64_t) { return 0.0f; }
};

struct Int4RowwiseRow {
  static constexpr bool kHasBias = true;
  static float Value(const TableView& t, int64_t row, int64_t d) {
    const unsigned char byte = Record(t, row)[kRecordHeaderBytes + d / 2];
    return static_cast<float>(d % 2 == 0 ? byte & 0x0F : byte >> 4);
  }
  static float Scale(const TableView& t, int64_t row) {
    return HalfAt(Record(t, row));
  }
  static float Bias(const TableView& t, int64_t row) {
    return HalfAt(Record(t, row) + 2);
  }
};

template <typename Row, typename Index>
bool LookupIds(const LookupArgs& a) {
  const Index* ids = static_cast<const Index*>(a.ids.data);
  const int64_t dim = a.table.dim;
  for (int64_t i = a.begin; i < a.end; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);  // read once, then use
    if (!InRange(id, a.table.rows)) return false;
    float* out = a.out + i * dim;
    const float scale = Row::Scale(a.table, id);
    for (int64_t d = 0; d < dim; ++d) {
      out[d] = Row::Value(a.table, id, d) * scale;
      if (Row::kHasBias) out[d] = out[d] + Row::Bias(a.table, id);
    }
  }
  return true;
}

template <typename Row, typename Index>
bool PoolBags(const PoolArgs& a) {
  const Index* ids = static_cast<const Index*>(a.ids.data);
  const int64_t dim = a.table.dim;
  for (int64_t b = a.bag_begin; b < a.bag_end; ++b) {
    float* out = a.out + b * a.out_stride;
    for (int64_t d = 0; d < dim; ++d) out[d] = 0.0f;
    float wsum = 0.0f;
    float w2sum = 0.0f;
    float bias_sum = 0.0f;
    for (int64_t i = a.bag_offsets[b]; i < a.bag_offsets[b + 1]; ++i) {
      const int64_t id = static_cast<int64_t>(ids[i]);
      if (!InRange(id, a.table.rows)) return false;
      const float w = a.weights ? a.weights[i] : 1.0f;
      // The weight is folded into the scale: one multiply per value, and
      // where w * scale or a decoded value overflows float32 the pooled
      // result is the same on every kernel variant (SIMD ones fold too).
      const float factor = w * Row::Scale(a.table, id);
      for (int64_t d = 0; d < dim; ++d) {
        out[d] = out[d] + factor * Row::Value(a.table, id, d);
      }
      if (Row::kHasBias) bias_sum = bias_sum + w * Row::Bias(a.table, id);
      wsum = wsum + w;
      w2sum = w2sum + w * w;
    }
    if (Row::kHasBias) {
      for (int64_t d = 0; d < dim; ++d) out[d] = out[d] + bias_sum;
    }
    float denom = 1.0f;
    if (a.combiner == Combiner::kMean) denom = wsum;
    if (a.combiner == Combiner::kSqrtN) denom = std::sqrt(w2sum);
    if (denom == 0.0f) {
      for (int64_t d = 0; d < dim; ++d) out[d] = 0.0f;
    } else if (a.combiner != Combiner::kSum) {
      for (int64_t d = 0; d < dim; ++d) out[d] = out[d] / denom;
    }
  }
  return true;
}

template <typename Row>
bool LookupByIndexWidth(const LookupArgs& a) {
  return a.ids.is_int64 ? LookupIds<Row, int64_t>(a)
                        : LookupIds<Row, int32_t>(a);
}

template <typename Row>
bool PoolByIndexWidth(const PoolArgs& a) {
  return a.ids.is_int64 ? PoolBags<Row, int64_t>(a) : PoolBags<Row, int32_t>(a);
}

}  // namespace

bool Lookup(const LookupArgs& args) {
  switch (args.table.storage) {
    case Storage::kInt8Split:
      return LookupByIndexWidth<Int8SplitRow>(args);
    case Storage::kFp16:
      return LookupByIndexWidth<Fp16Row>(args);
    case Storage::kInt8Rowwise:
      return LookupByIndexWidth<Int8RowwiseRow>(args);
    case Storage::kInt4Rowwise:
      return LookupByIndexWidth<Int4RowwiseRow>(args);
  }
  return false;
}

bool Pool(const PoolArgs& args) {
  switch (args.table.storage) {
    case Storage::kInt8Split:
      return PoolByIndexWidth<Int8SplitRow>(args);
    case Storage::kFp16:
      return PoolByIndexWidth<Fp16Row>(args);
    case Storage::kInt8Rowwise:
      return PoolByIndexWidth<Int8RowwiseRow>(args);
    case Storage::kInt4Rowwise:
      return PoolByIndexWidth<Int4RowwiseRow>(args);
  }
  return false;
}

}  // namespace scalar
}  // namespace tfce
