// `nibble verify A B`: whether two checkpoints hold the same model, linear by linear (dequantized
// weights) and tensor by tensor. Exit code 0 only when everything is identical, 1 when something
// differs, 2 when a checkpoint cannot be read (as cmp(1)).
#include <cstdio>
#include <memory>
#include <string>

#include <nibble/nibble.h>

#include "commands.h"

namespace nibble_cli {

namespace {

void PrintEntry(const nibble::VerifyEntry& e) {
  const std::string how = e.a == e.b ? e.a : "A " + e.a + ", B " + e.b;
  if (e.identical) {
    std::printf("  %-48s identical  (%s)\n", e.name.c_str(), how.c_str());
  } else if (e.a == "absent" || e.b == "absent") {
    std::printf("  %-48s DIFFERS    (%s)\n", e.name.c_str(), how.c_str());
  } else {
    std::printf("  %-48s DIFFERS    max |diff| %.6g, %lld of %lld values  (%s)\n", e.name.c_str(), e.max_abs_diff,
                static_cast<long long>(e.differing), static_cast<long long>(e.total), how.c_str());
  }
}

}  // namespace

Runner RegisterVerify(CLI::App& app) {
  auto r = std::make_shared<nibble::VerifyRequest>();
  auto only_differences = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "verify", "Compare two checkpoints (any formats): dequantized linear weights and every other tensor, value by value");
  cmd->add_option("A", r->a_dir, "First checkpoint directory")->required();
  cmd->add_option("B", r->b_dir, "Second checkpoint directory")->required();
  cmd->add_flag("--differences_only", *only_differences, "Print only what differs (and the summary)");
  return [r, only_differences]() -> int {
    auto rep = nibble::Verify(*r);
    if (!rep.ok()) {
      Fail(rep.error().message);
      return 2;
    }
    std::printf("A: %s (%s)\nB: %s (%s)\n", r->a_dir.c_str(), rep->a_format.c_str(), r->b_dir.c_str(), rep->b_format.c_str());
    int64_t linears = 0, same_linears = 0, tensors = 0, same_tensors = 0;
    for (bool linear : {true, false}) {
      std::printf("%s\n", linear ? "linears (dequantized weights):" : "other tensors:");
      for (const nibble::VerifyEntry& e : rep->entries) {
        if (e.linear != linear) continue;
        (linear ? linears : tensors) += 1;
        (linear ? same_linears : same_tensors) += e.identical ? 1 : 0;
        if (!e.identical || !*only_differences) PrintEntry(e);
      }
    }
    if (rep->identical()) {
      std::printf("identical: all %lld linears and %lld other tensors\n", static_cast<long long>(linears),
                  static_cast<long long>(tensors));
    } else {
      std::printf("DIFFERENT: %lld of %lld linears and %lld of %lld other tensors differ\n",
                  static_cast<long long>(linears - same_linears), static_cast<long long>(linears),
                  static_cast<long long>(tensors - same_tensors), static_cast<long long>(tensors));
    }
    return rep->identical() ? 0 : 1;
  };
}

}  // namespace nibble_cli
