#include "support/openmp_wait.h"

#include <cstdlib>

#include <unistd.h>

namespace nibble_cli {
namespace {
// Set together with GOMP_SPINCOUNT, so the re-executed program can tell its own default from the
// user's setting.
constexpr const char* kMarker = "NIBBLE_DEFAULT_GOMP_SPINCOUNT";
}  // namespace

void UseShortOpenMpSpin(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("GOMP_SPINCOUNT", kDefaultSpinCount, 1) != 0 || setenv(kMarker, "1", 1) != 0) return;
  execv("/proc/self/exe", argv);  // returns only on failure
  unsetenv("GOMP_SPINCOUNT");
  unsetenv(kMarker);
}

std::string DescribeOpenMpWait() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  std::string s;
  if (policy != nullptr) s = std::string("OMP_WAIT_POLICY=") + policy;
  if (spin != nullptr) s += (s.empty() ? "" : " ") + std::string("GOMP_SPINCOUNT=") + spin;
  if (s.empty()) return "libgomp's default";
  return s + (std::getenv(kMarker) != nullptr ? " (nibble's default)" : " (from the environment)");
}

}  // namespace nibble_cli
