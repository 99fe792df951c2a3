// The one dispatch table: which kernel variant runs, chosen once per process
// (TFCE_ISA, or the best variant this CPU can run).
#ifndef TFCE_KERNELS_CORE_DISPATCH_H_
#define TFCE_KERNELS_CORE_DISPATCH_H_

#include <string>

#include "kernels/core/kernel_api.h"

namespace tfce {

// One entry of the dispatch table: a kernel variant (one ISA, or the scalar
// reference), made from core/kernel_variants.inc.
struct KernelVariant {
  const char* name;       // its TFCE_ISA value
  bool (*cpu_can_run)();  // can this CPU+OS run it?
  LookupFn lookup;
  PoolFn pool;
};

// All variants, best first; the last is the scalar reference.
const KernelVariant* KernelVariants(int* num_variants);

// The variants this CPU can run, best first, comma-separated (what TFCE_ISA
// accepts); variants named in TFCE_HIDE_ISA (a test hook) count as ones it
// cannot run.
std::string SupportedVariantNames();

// The variant the ops run: TFCE_ISA if set, else the best one the CPU can
// run. Returns null and sets *error when TFCE_ISA names an unknown variant
// or one this CPU cannot run. Decided once; later calls return the same
// (unless a ScopedVariantOverride is alive).
const KernelVariant* SelectedVariant(std::string* error);

// Why SelectedVariant() returned null ("" if it did not).
const char* VariantSelectionError();

// For tests: while alive, SelectedVariant() returns `variant` (as FBGEMM's
// ScopedKernelOverride), so one process can run every variant through the
// path the ops take. Not thread-safe against a concurrent override; not
// nestable beyond restoring the previous one.
class ScopedVariantOverride {
 public:
  explicit ScopedVariantOverride(const KernelVariant* variant);
  ~ScopedVariantOverride();
  ScopedVariantOverride(const ScopedVariantOverride&) = delete;
  ScopedVariantOverride& operator=(const ScopedVariantOverride&) = delete;

 private:
  const KernelVariant* previous_;
};

}  // namespace tfce

#endif  // TFCE_KERNELS_CORE_DISPATCH_H_
