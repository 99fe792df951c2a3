#include "kernels/tf/huge_pages.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <set>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace tfce {
namespace {

// Buffers remembered at most; past that, new buffers are not advised (a
// process that keeps allocating new tables is not one to tune).
constexpr size_t kMaxBuffers = 4096;

bool Enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("TFCE_HUGE_PAGES");
    return value == nullptr || *value == '\0' || std::atoi(value) != 0;
  }();
  return enabled;
}

struct Registry {
  std::mutex mu;
  std::set<std::pair<uintptr_t, uintptr_t>> seen;  // aligned [begin, end)
};

Registry& TheRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

std::atomic<int64_t> collapsed_bytes{0};

}  // namespace

void AdviseHugePages(const void* data, int64_t bytes) {
  if (bytes < kHugePageMinBytes || data == nullptr || !Enabled()) return;
  const uintptr_t start = reinterpret_cast<uintptr_t>(data);
  const uintptr_t begin = (start + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  const uintptr_t end =
      (start + static_cast<uintptr_t>(bytes)) & ~(kHugePageBytes - 1);
  if (end <= begin) return;
  {
    Registry& r = TheRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.seen.size() >= kMaxBuffers) return;
    // Inserted before advising: a concurrent call for the same buffer
    // returns at once instead of collapsing it twice.
    if (!r.seen.emplace(begin, end).second) return;
  }
#if defined(__linux__)
  void* p = reinterpret_cast<void*>(begin);
  const size_t length = end - begin;
  // MADV_HUGEPAGE keeps the range eligible if the OS ever splits it;
  // MADV_COLLAPSE does the work now instead of waiting for khugepaged.
  madvise(p, length, kMadvHugepage);
  if (madvise(p, length, kMadvCollapse) == 0) {
    collapsed_bytes.fetch_add(static_cast<int64_t>(length));
  }
#endif
}

void AdviseHugePages(const TableView& table) {
  // rows * bytes is the size of an existing tensor: no overflow.
  AdviseHugePages(table.data, table.rows * RowBytes(table));
  if (table.scales != nullptr) {
    AdviseHugePages(table.scales, table.rows * ScaleBytes(table));
  }
}

int64_t HugePageBytes() { return collapsed_bytes.load(); }

}  // namespace tfce
