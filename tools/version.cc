// `nibble --version`: the release, the commit the binary was built from (CMake configure time)
// and the kernels compiled in and chosen on this CPU.
#include <string>

#include "commands.h"
#include "support/bench.h"

#ifndef NIBBLE_VERSION
#define NIBBLE_VERSION "unknown"
#endif
#ifndef NIBBLE_GIT_COMMIT
#define NIBBLE_GIT_COMMIT "unknown"
#endif

namespace nibble_cli {

std::string BuildCommit() { return NIBBLE_GIT_COMMIT; }

std::string VersionText() {
  const nibble::KernelDispatchReport k = nibble::DescribeKernels();
  std::string compiled;
  for (const auto& c : k.candidates)
    if (c.compiled) compiled += (compiled.empty() ? "" : " ") + c.isa;
  std::string text = std::string("nibble ") + NIBBLE_VERSION + " (commit " + NIBBLE_GIT_COMMIT + ")\n";
  text += "kernels compiled in: " + compiled + "\n";
  text += "kernels chosen: int4 " + k.chosen + " | int8 activations " + k.int8_kernel + " | bf16 activations " +
          k.bf16_act_kernel + " | row ops " + k.vec_ops;
  if (!k.override_value.empty()) text += " (NIBBLE_ISA=" + k.override_value + ")";
  return text;
}

}  // namespace nibble_cli
