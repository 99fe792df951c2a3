#include "kernels/core/dispatch.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/core/cpu_features.h"
#include "kernels/core/tuning_env.h"

namespace tfce {

// Entry points of each kernel file. Adding an ISA is one file plus one
// declaration block and one table row here.
namespace avx512 {
bool Lookup(const LookupArgs& args);
bool Pool(const PoolArgs& args);
}  // namespace avx512
namespace avx2 {
bool Lookup(const LookupArgs& args);
bool Pool(const PoolArgs& args);
}  // namespace avx2
namespace sse41 {
bool Lookup(const LookupArgs& args);
bool Pool(const PoolArgs& args);
}  // namespace sse41
namespace ref {
bool Lookup(const LookupArgs& args);
bool Pool(const PoolArgs& args);
}  // namespace ref

namespace {

// Each row needs every feature its file is compiled for (see setup.py).
bool HasAvx512() {
  const CpuFeatures& f = GetCpuFeatures();
  return f.avx512f && f.avx512bw && f.avx512vl && f.avx2 && f.fma && f.f16c;
}
bool HasAvx2() {
  const CpuFeatures& f = GetCpuFeatures();
  return f.avx2 && f.fma && f.f16c;
}
bool HasSse41() { return GetCpuFeatures().sse41; }
bool AlwaysSupported() { return true; }

const KernelSet kKernelTable[] = {
    {"avx512", &HasAvx512, &avx512::Lookup, &avx512::Pool},
    {"avx2", &HasAvx2, &avx2::Lookup, &avx2::Pool},
    {"sse", &HasSse41, &sse41::Lookup, &sse41::Pool},
    {"scalar", &AlwaysSupported, &ref::Lookup, &ref::Pool},
};
constexpr int kNumRows = sizeof(kKernelTable) / sizeof(kKernelTable[0]);

struct Selection {
  const KernelSet* kernels = nullptr;
  std::string error;
};

// TFCE_HIDE_ISA=avx512,avx2 (a test hook): those rows count as unsupported,
// so a host with every feature can play one without (the refusal of a
// forced row, the rows and the default a smaller CPU gets). The scalar row
// is the fallback and cannot be hidden.
bool HiddenByEnv(const char* isa) {
  const char* hidden = std::getenv("TFCE_HIDE_ISA");
  if (hidden == nullptr || std::strcmp(isa, "scalar") == 0) return false;
  const size_t n = std::strlen(isa);
  for (const char* p = hidden; *p != '\0';) {
    const char* end = std::strchr(p, ',');
    const size_t len = end ? static_cast<size_t>(end - p) : std::strlen(p);
    if (len == n && std::strncmp(p, isa, n) == 0) return true;
    if (end == nullptr) break;
    p = end + 1;
  }
  return false;
}

bool Available(const KernelSet& row) {
  return row.cpu_supports() && !HiddenByEnv(row.isa);
}

// The rows' names, best first, joined by `sep`: every row of the library,
// or only those this CPU can run.
std::string RowNames(bool available_only, const char* sep) {
  std::string names;
  for (const KernelSet& row : kKernelTable) {
    if (available_only && !Available(row)) continue;
    if (!names.empty()) names += sep;
    names += row.isa;
  }
  return names;
}

Selection Select() {
  Selection s;
  const char* forced = std::getenv("TFCE_ISA");
  if (forced == nullptr || *forced == '\0') {
    for (const KernelSet& row : kKernelTable) {
      if (Available(row)) {
        s.kernels = &row;
        return s;
      }
    }
    s.error = "no kernel row supports this CPU";  // unreachable: scalar
    return s;
  }
  for (const KernelSet& row : kKernelTable) {
    if (std::strcmp(row.isa, forced) != 0) continue;
    if (Available(row)) {
      s.kernels = &row;
    } else {
      s.error = std::string("TFCE_ISA=") + forced +
                " was requested but this CPU (or OS) does not support it; "
                "unset TFCE_ISA or choose a row this CPU supports: " +
                RowNames(true, ", ");
    }
    return s;
  }
  s.error = std::string("TFCE_ISA=") + forced +
            " is not a kernel row of this library; valid values: " +
            RowNames(false, ", ") + " (this CPU supports: " +
            RowNames(true, ", ") + ")";
  return s;
}

// TFCE_PREFETCH_ROWS (whole rows, at most 4096), or -1 if unset or not a
// whole number.
int64_t ForcedPrefetchRows() {
  static const int64_t forced = [] {
    const double rows = TuningEnv("TFCE_PREFETCH_ROWS", -1, 4096);
    return rows == std::floor(rows) ? static_cast<int64_t>(rows)
                                    : int64_t{-1};
  }();
  return forced;
}

}  // namespace

int64_t PrefetchRows() {
  const int64_t forced = ForcedPrefetchRows();
  return forced >= 0 ? forced : kDefaultPrefetchRows;
}

int64_t RowBytes(const TableView& table) {
  return table.dim * (table.storage == Storage::kInt8 ? 1 : 2);
}

int64_t ScaleBytes(const TableView& table) {
  return table.storage == Storage::kInt8 ? 4 : 0;
}

int64_t PrefetchDistance(const TableView& table) {
  return PrefetchDistance(RowBytes(table), ScaleBytes(table) > 0);
}

int64_t PrefetchDistance(int64_t row_bytes, bool scale_line) {
  const double lines =
      static_cast<double>(row_bytes) / 64 + 1 + (scale_line ? 1 : 0);
  const double rows = kPrefetchLines / lines;
  if (rows <= kMinPrefetchRows) return kMinPrefetchRows;
  if (rows >= kMaxPrefetchRows) return kMaxPrefetchRows;
  return static_cast<int64_t>(rows);
}

int64_t PoolPrefetchRows(const TableView& table, double ids_per_bag) {
  const int64_t forced = ForcedPrefetchRows();
  if (forced >= 0) return forced;
  if (ids_per_bag >= kLongBagIds && RowBytes(table) < 64) {
    // In doubles: rows * bytes of a view may exceed int64 in principle.
    const double table_bytes = static_cast<double>(table.rows) *
                               (RowBytes(table) + ScaleBytes(table));
    if (table_bytes <= static_cast<double>(kCachedTableL2Multiple) *
                           GetCpuFeatures().l2_cache_bytes) {
      return 0;
    }
  }
  return PrefetchDistance(table);
}

const KernelSet* KernelTable(int* num_rows) {
  *num_rows = kNumRows;
  return kKernelTable;
}

namespace {
const Selection& TheSelection() {
  static const Selection* selection = new Selection(Select());
  return *selection;
}
}  // namespace

std::string SupportedRowNames() { return RowNames(true, ","); }

const KernelSet* SelectedKernels(std::string* error) {
  const Selection& selection = TheSelection();
  if (selection.kernels == nullptr && error != nullptr) {
    *error = selection.error;
  }
  return selection.kernels;
}

}  // namespace tfce

// For the Python package and tests: the row the ops run, or "" when
// TFCE_ISA cannot be honoured (then tfce_isa_error() says why).
extern "C" __attribute__((visibility("default"))) const char* tfce_active_isa() {
  const tfce::KernelSet* kernels = tfce::SelectedKernels(nullptr);
  return kernels ? kernels->isa : "";
}

extern "C" __attribute__((visibility("default"))) const char* tfce_isa_error() {
  return tfce::TheSelection().error.c_str();
}

// Comma-separated rows this CPU can run, best first (what TFCE_ISA accepts).
extern "C" __attribute__((visibility("default"))) const char*
tfce_supported_isas() {
  static const std::string* names =
      new std::string(tfce::SupportedRowNames());
  return names->c_str();
}
