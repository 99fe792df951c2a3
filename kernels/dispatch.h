// The one dispatch table: which kernel set runs, chosen once per process.
#ifndef TFCE_KERNELS_DISPATCH_H_
#define TFCE_KERNELS_DISPATCH_H_

#include <cstdint>
#include <string>

#include "kernels/kernel_api.h"

namespace tfce {

struct KernelSet {
  const char* isa;            // the TFCE_ISA name of this row
  bool (*cpu_supports)();     // can this CPU+OS run the row?
  LookupFn lookup;
  PoolFn pool;
};

// All rows, best first; the last row is the scalar reference.
const KernelSet* KernelTable(int* num_rows);

// The row used by the ops: TFCE_ISA if set, else the best row the CPU
// supports. Returns null and sets *error when TFCE_ISA names an unknown row
// or one this CPU cannot run. Decided once; later calls return the same.
const KernelSet* SelectedKernels(std::string* error);

// How many ids ahead the pooling kernels prefetch rows: TFCE_PREFETCH_ROWS
// if set (0 disables), else kDefaultPrefetchRows. Read once per process.
constexpr int64_t kDefaultPrefetchRows = 16;
int64_t PrefetchRows();

}  // namespace tfce

#endif  // TFCE_KERNELS_DISPATCH_H_
