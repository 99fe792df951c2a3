// TF-free tests of the compute kernels, run for every row of the dispatch
// table this CPU supports:
//  - exact IEEE half -> float decoding (all 65536 bit patterns, against the
//    compiler's own _Float16 conversion);
//  - every row against an independent double-precision reference, dims
//    1..33, 64, 100, 128, 129, 257, both storage types, both id widths, all
//    combiners, weighted and not, with sentinel-padded outputs (no write
//    outside the rows asked for) and unaligned table/output pointers;
//  - every row returns false on ids < 0 or >= rows, as the reference does;
//  - the prefetch policy: no prefetch for cached tables of short rows.
// Prints "N passed, M failed" and exits non-zero on any failure.
#include <xmmintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/core/cpu_features.h"
#include "kernels/core/dispatch.h"
#include "kernels/core/fp16.h"
#include "kernels/core/kernel_api.h"
#include "kernels/core/tuning_env.h"

namespace tfce {
namespace {

int g_passed = 0;
int g_failed = 0;

void Check(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::printf("FAILED: %s\n", what.c_str());
  }
}

constexpr float kSentinel = -12345.5f;
constexpr int kPad = 16;  // sentinel floats before and after each output

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

void TestHalfDecoding() {
  int mismatches = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 half;
    const uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&half, &bits, 2);
    const float want = static_cast<float>(half);
    const float got = HalfBitsToFloat(bits);
    // NaNs must stay NaN (with sign); everything else bit-identical.
    const bool ok = std::isnan(want) ? (std::isnan(got) &&
                                        std::signbit(got) == std::signbit(want))
                                     : Bits(got) == Bits(want);
    if (!ok) ++mismatches;
  }
  Check(mismatches == 0, "HalfBitsToFloat on all 65536 half values: " +
                             std::to_string(mismatches) + " mismatches");
}

struct Table {
  Storage storage;
  int64_t rows, dim;
  // One spare element in front, so rows start off any vector alignment
  // (tables sliced from bigger tensors do).
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  std::vector<double> decoded;  // independent double-precision decode

  size_t elem() const { return storage == Storage::kInt8 ? 1 : 2; }
  const void* data() const { return bytes.data() + elem(); }
  TableView View() const {
    return TableView{storage, data(),
                     storage == Storage::kInt8 ? scales.data() : nullptr, rows,
                     dim};
  }
};

Table MakeTable(Storage storage, int64_t rows, int64_t dim, std::mt19937* rng) {
  Table t{storage, rows, dim, {}, {}, {}};
  t.bytes.assign((1 + rows * dim) * t.elem(), 0);
  t.decoded.resize(rows * dim);
  std::uniform_int_distribution<int> q(-127, 127);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  if (storage == Storage::kInt8) {
    t.scales.resize(rows);
    for (int64_t r = 0; r < rows; ++r) t.scales[r] = std::fabs(normal(*rng)) / 127;
  }
  for (int64_t i = 0; i < rows * dim; ++i) {
    if (storage == Storage::kInt8) {
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

// Output with kPad sentinels on each side; returns a deliberately
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

template <typename Index>
void TestRowLookup(const KernelSet& row, const Table& t, std::mt19937* rng) {
  const int64_t n = 23;
  std::vector<Index> ids(n);
  std::uniform_int_distribution<int64_t> pick(0, t.rows - 1);
  for (auto& id : ids) id = static_cast<Index>(pick(*rng));
  ids[0] = static_cast<Index>(t.rows - 1);
  Padded out(n * t.dim);
  // Decode positions [3, n): rows 0..2 must keep their sentinels.
  LookupArgs args{t.View(), IdsView{ids.data(), sizeof(Index) == 8}, 3, n,
                  out.out(), /*prefetch_rows=*/4};
  const std::string where = std::string(row.isa) + " lookup " +
                            (t.storage == Storage::kInt8 ? "int8" : "fp16") +
                            " dim=" + std::to_string(t.dim) +
                            " idx" + std::to_string(8 * sizeof(Index));
  Check(row.lookup(args), where + ": returned false on valid ids");
  bool exact = true, untouched = true;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t d = 0; d < t.dim; ++d) {
      const float got = out.out()[i * t.dim + d];
      if (i < 3) {
        untouched &= got == kSentinel;
      } else {
        exact &= got == static_cast<float>(t.decoded[ids[i] * t.dim + d]);
      }
    }
  }
  Check(exact, where + ": differs from the reference decode");
  Check(untouched && out.PadsIntact(), where + ": wrote outside its rows");
  for (int64_t bad : {int64_t{-1}, t.rows}) {
    ids[5] = static_cast<Index>(bad);
    Check(!row.lookup(args), where + ": accepted id " + std::to_string(bad));
  }
}

template <typename Index>
void TestRowPool(const KernelSet& row, const Table& t, Combiner combiner,
                 bool weighted, std::mt19937* rng) {
  // Bags: 0 empty, 1 long, 2 single, 3 duplicates, 4 empty, 5 mixed.
  const std::vector<int64_t> sizes = {0, 70, 1, 6, 0, 9};
  std::vector<int64_t> offsets = {0};
  for (int64_t s : sizes) offsets.push_back(offsets.back() + s);
  const int64_t n = offsets.back(), bags = sizes.size();
  std::vector<Index> ids(n);
  std::vector<float> weights(n);
  std::uniform_int_distribution<int64_t> pick(0, t.rows - 1);
  std::uniform_real_distribution<float> w(0.5f, 1.5f);
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = static_cast<Index>(i >= offsets[3] && i < offsets[4] ? 4 : pick(*rng));
    weights[i] = w(*rng);
  }
  ids[offsets[1]] = static_cast<Index>(t.rows - 1);
  Padded out(bags * t.dim);
  PoolArgs args{t.View(), IdsView{ids.data(), sizeof(Index) == 8},
                weighted ? weights.data() : nullptr, offsets.data(), combiner,
                1, bags, out.out(),  // bag 0 is left to other threads
                /*prefetch_rows=*/3};
  const std::string where =
      std::string(row.isa) + " pool " +
      (t.storage == Storage::kInt8 ? "int8" : "fp16") + " dim=" +
      std::to_string(t.dim) + " combiner=" +
      std::to_string(static_cast<int>(combiner)) +
      (weighted ? " weighted" : "") + " idx" + std::to_string(8 * sizeof(Index));
  Check(row.pool(args), where + ": returned false on valid ids");
  bool close = true, untouched = true;
  for (int64_t d = 0; d < t.dim; ++d) untouched &= out.out()[d] == kSentinel;
  for (int64_t b = 1; b < bags; ++b) {
    for (int64_t d = 0; d < t.dim; ++d) {
      double sum = 0, mag = 0, wsum = 0, w2sum = 0;
      for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) {
        const double wi = weighted ? weights[i] : 1.0;
        const double term = wi * t.decoded[ids[i] * t.dim + d];
        sum += term;
        mag += std::fabs(term);
        wsum += wi;
        w2sum += wi * wi;
      }
      double denom = 1;
      if (combiner == Combiner::kMean) denom = wsum;
      if (combiner == Combiner::kSqrtN) denom = std::sqrt(w2sum);
      const double want = denom == 0 ? 0 : sum / denom;
      // float32 accumulation of L terms, plus the divide and last rounding.
      const double bound = denom == 0 ? 0
          : (sizes[b] + 2) * 1.1920929e-7 * mag / std::fabs(denom) + 1e-30;
      close &= std::fabs(out.out()[b * t.dim + d] - want) <= bound;
    }
  }
  Check(close, where + ": beyond the float32 accumulation bound");
  Check(untouched && out.PadsIntact(), where + ": wrote outside its bags");
  for (int64_t bad : {int64_t{-1}, t.rows}) {
    ids[offsets[5] + 2] = static_cast<Index>(bad);
    Check(!row.pool(args), where + ": accepted id " + std::to_string(bad));
  }
}

// Every half value through each row's lookup, with the denormals-are-zero
// and flush-to-zero modes TensorFlow's threads run with: subnormal halves
// must still decode exactly.
void TestAllHalvesUnderDaz(const KernelSet& row) {
  const unsigned int saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);  // DAZ | FTZ
  std::vector<uint16_t> table(65536);
  for (uint32_t h = 0; h < 65536; ++h) table[h] = static_cast<uint16_t>(h);
  const int64_t id = 0;
  std::vector<float> out(65536);
  LookupArgs args{TableView{Storage::kFp16, table.data(), nullptr, 1, 65536},
                  IdsView{&id, true}, 0, 1, out.data(), 0};
  const bool ok = row.lookup(args);
  _mm_setcsr(saved);
  int mismatches = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = HalfBitsToFloat(static_cast<uint16_t>(h));
    const bool same = std::isnan(want)
                          ? std::isnan(out[h]) &&
                                std::signbit(out[h]) == std::signbit(want)
                          : Bits(out[h]) == Bits(want);
    if (!same) ++mismatches;
  }
  Check(ok && mismatches == 0, std::string(row.isa) +
                                   ": all 65536 halves under DAZ/FTZ: " +
                                   std::to_string(mismatches) + " mismatches");
}

void TestAllRows() {
  int num_rows = 0;
  const KernelSet* rows = KernelTable(&num_rows);
  Check(std::strcmp(rows[num_rows - 1].isa, "scalar") == 0,
        "the last row of the dispatch table is the scalar reference");
  std::vector<int64_t> dims;
  for (int64_t d = 1; d <= 33; ++d) dims.push_back(d);
  for (int64_t d : {64, 100, 128, 129, 257}) dims.push_back(d);
  for (int r = 0; r < num_rows; ++r) {
    const KernelSet& row = rows[r];
    if (!row.cpu_supports()) {
      std::printf("skipping row %s: not supported by this CPU\n", row.isa);
      continue;
    }
    TestAllHalvesUnderDaz(row);
    std::mt19937 rng(1234);
    for (Storage storage : {Storage::kInt8, Storage::kFp16}) {
      for (int64_t dim : dims) {
        const Table t = MakeTable(storage, 31, dim, &rng);
        TestRowLookup<int32_t>(row, t, &rng);
        TestRowLookup<int64_t>(row, t, &rng);
        for (Combiner c : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtN}) {
          for (bool weighted : {false, true}) {
            TestRowPool<int32_t>(row, t, c, weighted, &rng);
            TestRowPool<int64_t>(row, t, c, weighted, &rng);
          }
        }
      }
    }
  }
}

// Run without TFCE_PREFETCH_ROWS: the default policy, at its boundaries.
void TestPrefetchPolicy() {
  if (std::getenv("TFCE_PREFETCH_ROWS") != nullptr) {
    std::printf("TFCE_PREFETCH_ROWS is set: prefetch policy not tested\n");
    return;
  }
  const int64_t l2 = GetCpuFeatures().l2_cache_bytes;
  Check(l2 >= 64 * 1024, "L2 cache size read (" + std::to_string(l2) + ")");
  const int64_t cached = kCachedTableL2Multiple * l2;
  const int64_t huge = int64_t{1} << 40;  // rows: far beyond any cache
  auto prefetch = [](Storage storage, int64_t rows, int64_t dim, double bag) {
    return PoolPrefetchRows(TableView{storage, nullptr, nullptr, rows, dim},
                            bag);
  };
  auto name = [](const char* storage, int64_t dim, const char* what) {
    return std::string(storage) + " dim " + std::to_string(dim) + " " + what;
  };
  const double long_bag = kLongBagIds, short_bag = kLongBagIds - 0.01;
  // No prefetch only for long bags of rows under a cache line of a cached
  // table. Bytes per row: int8 dim + a 4-byte scale, fp16 2 * dim.
  struct Format {
    Storage storage;
    const char* name;
    int64_t elem_bytes, scale_bytes, largest_short_dim;
  };
  for (const Format& f : {Format{Storage::kInt8, "int8", 1, 4, 63},
                          Format{Storage::kFp16, "fp16", 2, 0, 31}}) {
    for (int64_t dim : {int64_t{1}, int64_t{12}, f.largest_short_dim}) {
      const int64_t rows = cached / (dim * f.elem_bytes + f.scale_bytes);
      Check(prefetch(f.storage, rows, dim, long_bag) == 0,
            name(f.name, dim, "cached: no prefetch"));
      const int64_t distance =
          PrefetchDistance(TableView{f.storage, nullptr, nullptr, rows, dim});
      Check(prefetch(f.storage, rows + 1, dim, long_bag) == distance,
            name(f.name, dim, "past the cache: prefetch"));
      Check(prefetch(f.storage, rows, dim, short_bag) == distance,
            name(f.name, dim, "cached, short bags: prefetch"));
      Check(prefetch(f.storage, huge, dim, long_bag) == distance,
            name(f.name, dim, "huge table: prefetch"));
    }
  }
  // Rows of a cache line or more are prefetched at any table size.
  Check(prefetch(Storage::kInt8, 10, 64, 100) == 21, "int8 dim 64: prefetch");
  Check(prefetch(Storage::kFp16, 10, 32, 100) == 32, "fp16 dim 32: prefetch");
  Check(PrefetchRows() == kDefaultPrefetchRows, "lookup: fixed distance");
  // About kPrefetchLines lines in flight: 64 / (bytes / 64 + 1 [+ 1 for
  // an int8 row's scale]) rows, within [kMinPrefetchRows, kMaxPrefetchRows].
  struct Distance {
    Storage storage;
    int64_t dim, rows;
  };
  for (const Distance& d : {Distance{Storage::kInt8, 12, 29},
                            Distance{Storage::kInt8, 128, 16},
                            Distance{Storage::kFp16, 12, 46},
                            Distance{Storage::kFp16, 128, 12},
                            Distance{Storage::kFp16, 1, kMaxPrefetchRows},
                            Distance{Storage::kFp16, 4096, kMinPrefetchRows}}) {
    const int64_t got =
        PrefetchDistance(TableView{d.storage, nullptr, nullptr, 1000, d.dim});
    Check(got == d.rows, std::string(d.storage == Storage::kInt8 ? "int8" : "fp16") +
                             " dim " + std::to_string(d.dim) + " prefetches " +
                             std::to_string(got) + " rows ahead");
  }
}

// Tuning variables: a number >= 0 clamped to max, else the fallback; never
// a failure.
void TestTuningEnv() {
  const char* kName = "TFCE_TEST_TUNING_VALUE";
  struct Case {
    const char* value;  // nullptr: unset
    double expected;
  };
  for (const Case& c : {Case{nullptr, -1}, Case{"", -1}, Case{"0", 0},
                        Case{"16", 16}, Case{"2.5e3", 2500}, Case{"4096", 4096},
                        Case{"4097", 4096}, Case{"inf", 4096}, Case{"-1", -1},
                        Case{"16x", -1}, Case{"abc", -1}, Case{"nan", -1},
                        Case{" 8", 8}}) {
    if (c.value == nullptr) {
      unsetenv(kName);
    } else {
      setenv(kName, c.value, 1);
    }
    const double got = TuningEnv(kName, -1, 4096);
    Check(got == c.expected, std::string("TuningEnv(\"") +
                                 (c.value ? c.value : "<unset>") + "\") = " +
                                 std::to_string(got));
  }
  // An infinite maximum lets "inf" through (TFCE_MIN_PARALLEL_COST=inf: the
  // ops never split a call).
  setenv(kName, "inf", 1);
  Check(std::isinf(TuningEnv(kName, -1, HUGE_VAL)), "TuningEnv(\"inf\"), no max");
  unsetenv(kName);
}

}  // namespace
}  // namespace tfce

int main() {
  tfce::TestTuningEnv();
  tfce::TestPrefetchPolicy();
  tfce::TestHalfDecoding();
  tfce::TestAllRows();
  std::printf("%d passed, %d failed\n", tfce::g_passed, tfce::g_failed);
  return tfce::g_failed == 0 ? 0 : 1;
}
