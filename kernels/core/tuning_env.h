// The TFCE_* tuning numbers (prefetch distance, threading): read once per
// process by their users. A tuning hint never fails a call, so a value that
// is not a number is ignored. (TFCE_HUGE_PAGES is an on/off switch, read in
// huge_pages.cc.)
#ifndef TFCE_KERNELS_CORE_TUNING_ENV_H_
#define TFCE_KERNELS_CORE_TUNING_ENV_H_

#include <cstdlib>

namespace tfce {

// The value of `name`: a number >= 0, clamped to `max` (`inf` included when
// `max` is infinite); `fallback` if unset, empty, not a number (trailing
// characters, NaN) or negative.
inline double TuningEnv(const char* name, double fallback, double max) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const double parsed = std::strtod(value, &end);
  if (*end != '\0' || !(parsed >= 0)) return fallback;  // NaN fails >= 0
  return parsed < max ? parsed : max;
}

}  // namespace tfce

#endif  // TFCE_KERNELS_CORE_TUNING_ENV_H_
