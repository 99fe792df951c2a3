#include "kernels/core/dispatch.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/core/cpu_features.h"
#include "kernels/core/kernel_variants.h"

namespace tfce {
namespace {

// Each variant needs every feature its file is compiled for (see
// kernels/sources.bzl and kernel_variants.inc).
#define TFCE_KERNEL_VARIANT(name, cpu_can_run) \
  bool CpuCanRun_##name() {                    \
    const CpuFeatures& f = GetCpuFeatures();   \
    static_cast<void>(f);                      \
    return cpu_can_run;                        \
  }
#include "kernels/core/kernel_variants.inc"
#undef TFCE_KERNEL_VARIANT

const KernelVariant kKernelVariants[] = {
#define TFCE_KERNEL_VARIANT(name, cpu_can_run) \
  {#name, &CpuCanRun_##name, &name::Lookup, &name::Pool},
#include "kernels/core/kernel_variants.inc"
#undef TFCE_KERNEL_VARIANT
};
constexpr int kNumVariants =
    sizeof(kKernelVariants) / sizeof(kKernelVariants[0]);
const char* const kFallback = kKernelVariants[kNumVariants - 1].name;

struct Selection {
  const KernelVariant* variant = nullptr;
  std::string error;
};

// TFCE_HIDE_ISA=avx512,avx2 (a test hook): those variants count as ones the
// CPU cannot run, so a host with every feature can play one without (the
// refusal of a forced variant, the list and the default a smaller CPU
// gets). The scalar reference is the fallback and cannot be hidden.
bool HiddenByEnv(const char* name) {
  const char* hidden = std::getenv("TFCE_HIDE_ISA");
  if (hidden == nullptr || std::strcmp(name, kFallback) == 0) return false;
  const size_t n = std::strlen(name);
  for (const char* p = hidden; *p != '\0';) {
    const char* end = std::strchr(p, ',');
    const size_t len = end ? static_cast<size_t>(end - p) : std::strlen(p);
    if (len == n && std::strncmp(p, name, n) == 0) return true;
    if (end == nullptr) break;
    p = end + 1;
  }
  return false;
}

bool Available(const KernelVariant& variant) {
  return variant.cpu_can_run() && !HiddenByEnv(variant.name);
}

// The variants' names, best first, joined by `sep`: every variant of the
// library, or only those this CPU can run.
std::string VariantNames(bool available_only, const char* sep) {
  std::string names;
  for (const KernelVariant& variant : kKernelVariants) {
    if (available_only && !Available(variant)) continue;
    if (!names.empty()) names += sep;
    names += variant.name;
  }
  return names;
}

// The messages name "kernel rows": the public word of TFCE_ISA's docs and
// error messages, which users and tests match.
Selection Select() {
  Selection s;
  const char* forced = std::getenv("TFCE_ISA");
  if (forced == nullptr || *forced == '\0') {
    for (const KernelVariant& variant : kKernelVariants) {
      if (Available(variant)) {
        s.variant = &variant;
        return s;
      }
    }
    s.error = "no kernel row supports this CPU";  // unreachable: scalar
    return s;
  }
  for (const KernelVariant& variant : kKernelVariants) {
    if (std::strcmp(variant.name, forced) != 0) continue;
    if (Available(variant)) {
      s.variant = &variant;
    } else {
      s.error = std::string("TFCE_ISA=") + forced +
                " was requested but this CPU (or OS) does not support it; "
                "unset TFCE_ISA or choose a row this CPU supports: " +
                VariantNames(true, ", ");
    }
    return s;
  }
  s.error = std::string("TFCE_ISA=") + forced +
            " is not a kernel row of this library; valid values: " +
            VariantNames(false, ", ") +
            " (this CPU supports: " + VariantNames(true, ", ") + ")";
  return s;
}

const Selection& TheSelection() {
  static const Selection* selection = new Selection(Select());
  return *selection;
}

std::atomic<const KernelVariant*> g_override{nullptr};

}  // namespace

const KernelVariant* KernelVariants(int* num_variants) {
  *num_variants = kNumVariants;
  return kKernelVariants;
}

std::string SupportedVariantNames() { return VariantNames(true, ","); }

const KernelVariant* SelectedVariant(std::string* error) {
  const KernelVariant* forced = g_override.load(std::memory_order_acquire);
  if (forced != nullptr) return forced;
  const Selection& selection = TheSelection();
  if (selection.variant == nullptr && error != nullptr) {
    *error = selection.error;
  }
  return selection.variant;
}

const char* VariantSelectionError() { return TheSelection().error.c_str(); }

ScopedVariantOverride::ScopedVariantOverride(const KernelVariant* variant)
    : previous_(g_override.exchange(variant, std::memory_order_acq_rel)) {}

ScopedVariantOverride::~ScopedVariantOverride() {
  g_override.store(previous_, std::memory_order_release);
}

}  // namespace tfce
