// nibble — quantize LLMs to 4-bit weights and run them on the CPU.
#include <cstdio>
#include <vector>

#include "commands.h"

namespace nibble_cli {
int Fail(const std::string& message) {
  std::fprintf(stderr, "nibble: error: %s\n", message.c_str());
  return 1;
}
}  // namespace nibble_cli

int main(int argc, char** argv) {
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, run] : commands)
    if (sub->parsed()) return run();
  return 1;
}
