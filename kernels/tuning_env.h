// The TFCE_* tuning variables (prefetch distance, threading, huge pages):
// read once per process by their users. A tuning hint never fails a call,
// so a value that is not a number in the valid range is ignored.
#ifndef TFCE_KERNELS_TUNING_ENV_H_
#define TFCE_KERNELS_TUNING_ENV_H_

#include <cstdlib>

namespace tfce {

// The value of `name` if it is a number in [0, max], else `fallback`
// (unset, empty, trailing characters, negative, too large, NaN).
inline double TuningEnv(const char* name, double fallback, double max) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const double parsed = std::strtod(value, &end);
  return (*end == '\0' && parsed >= 0 && parsed <= max) ? parsed : fallback;
}

}  // namespace tfce

#endif  // TFCE_KERNELS_TUNING_ENV_H_
