#include "support/load_env.h"

#include <dlfcn.h>
#include <strings.h>
#include <unistd.h>

#include <cstdlib>

namespace nibble_cli {
namespace {
// Set together with each default, so the re-executed program can tell its own default from the
// user's setting.
constexpr const char* kSpinMarker = "NIBBLE_DEFAULT_GOMP_SPINCOUNT";
constexpr const char* kBlasMarker = "NIBBLE_DEFAULT_OPENBLAS_CORETYPE";

// OpenBLAS's name for the kernels it runs, or nullptr without OpenBLAS (LAPACK from another
// library): looked up at run time, as the program links LAPACK, not OpenBLAS.
const char* OpenBlasCoreName() {
  using CoreName = char* (*)();
  const auto f = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  return f != nullptr ? f() : nullptr;
}

bool CpuHasAvx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

}  // namespace

const char* BlasCoreFor(const std::string& detected, bool avx512, bool avx2_fma) {
  if (strcasecmp(detected.c_str(), "prescott") != 0) return nullptr;
  if (avx512) return "SkylakeX";
  return avx2_fma ? "Haswell" : nullptr;
}

void UseLoadTimeDefaults(char** argv) {
  bool spin = false, blas = false;
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr)
    spin = setenv("GOMP_SPINCOUNT", kDefaultSpinCount, 1) == 0 && setenv(kSpinMarker, "1", 1) == 0;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    const char* detected = OpenBlasCoreName();
    const char* core = detected == nullptr ? nullptr
                                           : BlasCoreFor(detected, CpuHasAvx512(),
                                                         __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
    blas = core != nullptr && setenv("OPENBLAS_CORETYPE", core, 1) == 0 && setenv(kBlasMarker, "1", 1) == 0;
  }
  if (!spin && !blas) return;
  execv("/proc/self/exe", argv);  // returns only on failure
  if (spin) {
    unsetenv("GOMP_SPINCOUNT");
    unsetenv(kSpinMarker);
  }
  if (blas) {
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv(kBlasMarker);
  }
}

std::string DescribeOpenMpWait() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  std::string s;
  if (policy != nullptr) s = std::string("OMP_WAIT_POLICY=") + policy;
  if (spin != nullptr) s += (s.empty() ? "" : " ") + std::string("GOMP_SPINCOUNT=") + spin;
  if (s.empty()) return "libgomp's default";
  return s + (std::getenv(kSpinMarker) != nullptr ? " (nibble's default)" : " (from the environment)");
}

std::string DescribeBlasCore() {
  const char* core = OpenBlasCoreName();
  if (core == nullptr) return "no OpenBLAS";
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) return core;
  return std::string(core) + (std::getenv(kBlasMarker) != nullptr ? " (nibble's default)" : " (from the environment)");
}

}  // namespace nibble_cli
