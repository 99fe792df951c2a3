// Links //kernels:ops statically into a binary together with TensorFlow's
// framework library and checks that both ops are registered in the global op
// registry, each with a CPU kernel. Fails when alwayslink is lost (the
// registrations are static initializers nothing references).
//
// No test framework: prints one line per op and "N passed, M failed", and
// returns nonzero on any failure.
#include <cstdio>
#include <string>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_def.pb.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace {

const char* const kOps[] = {"CompressedEmbeddingLookup", "FusedDecodeAxpy",
                            "BatchedFusedDecodeAxpy"};

// Returns an empty string when `name` is registered with a CPU kernel,
// otherwise what is wrong.
std::string CheckOp(const std::string& name) {
  const tensorflow::OpDef* op_def = nullptr;
  const absl::Status status =
      tensorflow::OpRegistry::Global()->LookUpOpDef(name, &op_def);
  if (!status.ok()) return "not registered: " + std::string(status.message());
  if (op_def == nullptr || op_def->name() != name) {
    return "LookUpOpDef returned another op";
  }
  const std::string kernels = tensorflow::KernelsRegisteredForOp(name);
  if (kernels.find("device='CPU'") == std::string::npos) {
    return "registered, but no CPU kernel (kernels: " + kernels + ")";
  }
  return "";
}

}  // namespace

int main() {
  int passed = 0;
  int failed = 0;
  for (const char* name : kOps) {
    const std::string error = CheckOp(name);
    if (error.empty()) {
      ++passed;
      std::printf("PASS %s\n", name);
    } else {
      ++failed;
      std::printf("FAIL %s: %s\n", name, error.c_str());
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
