// The CLI's OpenMP wait policy.
#pragma once

#include <string>

namespace nibble_cli {

/// libgomp reads its wait policy once, when it loads (before main): a thread that finishes its
/// share of a parallel region spins GOMP_SPINCOUNT times (libgomp's default: 300000) before it
/// sleeps. On a machine with other work those spinning threads hold the cores that the
/// descheduled ones need to finish, and every region waits for the slowest. Unless the user set
/// OMP_WAIT_POLICY or GOMP_SPINCOUNT, this sets GOMP_SPINCOUNT to kDefaultSpinCount and
/// re-executes the program once (argv unchanged) so libgomp starts with it; if the re-exec fails
/// the program goes on with libgomp's default.
void UseShortOpenMpSpin(char** argv);

/// "GOMP_SPINCOUNT=N (nibble's default)", "... (from the environment)" or "libgomp's default" (the
/// re-exec failed), for `inspect --kernels`.
std::string DescribeOpenMpWait();

/// NIBBLE_GOMP_SPINCOUNT in CMakeLists.txt (the tests run with it too), chosen by
/// bench/threads_under_load.sh (docs/PERFORMANCE.md).
inline constexpr const char* kDefaultSpinCount = NIBBLE_GOMP_SPINCOUNT;

}  // namespace nibble_cli
