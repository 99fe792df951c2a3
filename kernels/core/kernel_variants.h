// The entry points of every kernel variant, declared from the one list in
// kernel_variants.inc: tfce::<name>::Lookup and tfce::<name>::Pool, defined
// in core/kernel_<name>.cc.
#ifndef TFCE_KERNELS_CORE_KERNEL_VARIANTS_H_
#define TFCE_KERNELS_CORE_KERNEL_VARIANTS_H_

#include "kernels/core/kernel_api.h"

namespace tfce {

#define TFCE_KERNEL_VARIANT(name, cpu_can_run) \
  namespace name {                             \
  bool Lookup(const LookupArgs& args);         \
  bool Pool(const PoolArgs& args);             \
  }
#include "kernels/core/kernel_variants.inc"
#undef TFCE_KERNEL_VARIANT

}  // namespace tfce

#endif  // TFCE_KERNELS_CORE_KERNEL_VARIANTS_H_
