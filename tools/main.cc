// nibble — quantize LLMs to 4-bit weights and run them on the CPU.
#include <malloc.h>

#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"

namespace nibble_cli {
int Fail(const std::string& message) {
  std::fprintf(stderr, "nibble: error: %s\n", message.c_str());
  return 1;
}

std::string Int8NotServed(const std::string& dir) {
  return "--int8_activations: " + dir +
         " has no int4 linear the int8 kernels serve (dense model, or group sizes other than 32, 64, 128*j)";
}
}  // namespace nibble_cli

int main(int argc, char** argv) {
  // Keep freed blocks up to 32 MiB in the heap instead of returning them to the kernel: AWQ's grid
  // search and the chunked forwards allocate and free the same activation buffers thousands of
  // times, and a fresh mmap each time costs page faults plus zeroing (measured: ~19 % of an AWQ
  // run in the kernel and memset before this).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  CLI::App app{"nibble: quantize LLMs to 4-bit weights (Quark hf_format) and run them on the CPU"};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, nibble_cli::Runner>> commands;
  auto add = [&](nibble_cli::Runner (*reg)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    nibble_cli::Runner r = reg(app);
    commands.emplace_back(app.get_subcommands({})[before], std::move(r));
  };
  add(nibble_cli::RegisterGenerate);
  add(nibble_cli::RegisterPerplexity);
  add(nibble_cli::RegisterQuantize);
  add(nibble_cli::RegisterInspect);
  add(nibble_cli::RegisterBench);
  add(nibble_cli::RegisterSynth);
  add(nibble_cli::RegisterCompare);
  add(nibble_cli::RegisterReport);
  // Name an unknown command instead of CLI11's generic "A subcommand is required".
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (auto& [sub, run] : commands) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) return nibble_cli::Fail(std::string("unknown command \"") + argv[1] + "\" (commands: " + names + ")");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, run] : commands)
    if (sub->parsed()) return run();
  return 1;
}
