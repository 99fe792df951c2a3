// The library's C ABI: every symbol the Python loader
// (tf_compressed_embedding/_loader.py) reads, by name, with ctypes or from
// the file. The names and types are fixed: released loaders call them.
#include <cstdint>
#include <string>

#include "kernels/core/dispatch.h"
#include "kernels/tf/huge_pages.h"

#ifndef TFCE_TF_VERSION  // set by setup.py and tools/configure_bazel.py
#define TFCE_TF_VERSION "unknown"
#endif

#define TFCE_C_API extern "C" __attribute__((visibility("default")))

// Read by the Python loader (without loading) to check that this library was
// built against the TensorFlow it is about to be loaded into.
TFCE_C_API __attribute__((used)) const char tfce_build_info[] =
    "TFCE_BUILT_FOR_TF=" TFCE_TF_VERSION ";";

// The kernel variant the ops run (its TFCE_ISA name), or "" when TFCE_ISA
// cannot be honoured (then tfce_isa_error() says why).
TFCE_C_API const char* tfce_active_isa() {
  const tfce::KernelVariant* variant = tfce::SelectedVariant(nullptr);
  return variant ? variant->name : "";
}

TFCE_C_API const char* tfce_isa_error() {
  return tfce::VariantSelectionError();
}

// Comma-separated variants this CPU can run, best first (what TFCE_ISA
// accepts).
TFCE_C_API const char* tfce_supported_isas() {
  static const std::string* names =
      new std::string(tfce::SupportedVariantNames());
  return names->c_str();
}

// Bytes of tables collapsed to huge pages so far in this process.
TFCE_C_API int64_t tfce_huge_page_bytes() { return tfce::HugePageBytes(); }
