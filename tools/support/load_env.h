// Settings the CLI's libraries read once, when they load (before main): libgomp's wait policy and
// OpenBLAS's kernels (GPTQ's Cholesky goes through LAPACK from OpenBLAS).
#pragma once

#include <string>

namespace nibble_cli {

/// Two defaults, each kept when the user set the variable, then one re-execution of the program
/// (argv unchanged) so the libraries start with them; if the re-exec fails the program goes on
/// with the libraries' own defaults.
/// - libgomp: a thread that finishes its share of a parallel region spins GOMP_SPINCOUNT times
///   (libgomp's default: 300000) before it sleeps. On a machine with other work those spinning
///   threads hold the cores that the descheduled ones need, and every region waits for the
///   slowest. Unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set: GOMP_SPINCOUNT=kDefaultSpinCount.
/// - OpenBLAS picks its kernels by CPU model, and Debian's 0.3.21 takes CPUs it does not know
///   (Sapphire and Emerald Rapids Xeons) for a "Prescott" and runs SSE3 code. Unless
///   OPENBLAS_CORETYPE is set, and only where OpenBLAS reports Prescott on a CPU with AVX-512 or
///   AVX2: OPENBLAS_CORETYPE=SkylakeX or Haswell (BlasCoreFor).
void UseLoadTimeDefaults(char** argv);

/// The core to ask OpenBLAS for, given the one it chose and the CPU's features; nullptr to keep
/// its choice.
const char* BlasCoreFor(const std::string& detected, bool avx512, bool avx2_fma);

/// "GOMP_SPINCOUNT=N (nibble's default)", "... (from the environment)" or "libgomp's default" (the
/// re-exec failed), for `inspect --kernels`.
std::string DescribeOpenMpWait();

/// OpenBLAS's core in this process ("SkylakeX (nibble's default)", "Zen", "SkylakeX (from the
/// environment)"), or "no OpenBLAS" when LAPACK comes from elsewhere, for `inspect --kernels`.
std::string DescribeBlasCore();

/// NIBBLE_GOMP_SPINCOUNT in CMakeLists.txt (the tests run with it too), chosen by
/// bench/threads_under_load.sh (docs/PERFORMANCE.md).
inline constexpr const char* kDefaultSpinCount = NIBBLE_GOMP_SPINCOUNT;

}  // namespace nibble_cli
