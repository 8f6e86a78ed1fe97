// `nibble export-onnx ...`: runs nibble-export-onnx from nibble's own directory with the same
// arguments (ONNX's protobuf runtime cannot share a process with SentencePiece's; see
// include/nibble/export_onnx.h). The build makes both (target nibble depends on it) and
// `cmake --install` installs both; a copy of nibble alone is told what is missing.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"

namespace nibble_cli {

Runner RegisterExportOnnx(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "export-onnx", "Write an int4 checkpoint as an ONNX Runtime GenAI model (MatMulNBits); --help lists its flags");
  cmd->prefix_command();
  cmd->set_help_flag();
  return [cmd]() -> int {
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) return Fail("cannot find nibble's own path (/proc/self/exe): " + ec.message());
    const std::string helper = (self.parent_path() / "nibble-export-onnx").string();
    if (access(helper.c_str(), X_OK) != 0)
      return Fail("export-onnx runs the program " + helper + " (beside nibble), which " +
                  (errno == ENOENT ? std::string("does not exist") : "cannot be run: " + std::string(std::strerror(errno))) +
                  ": build it with `cmake --build build/release --target nibble-export-onnx` (building nibble builds it "
                  "too), or install both with `cmake --install build/release --prefix DIR`");
    std::vector<std::string> args = cmd->remaining();
    std::vector<char*> argv = {const_cast<char*>(helper.c_str())};
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::fflush(nullptr);
    execv(helper.c_str(), argv.data());
    return Fail("cannot run " + helper + ": " + std::strerror(errno));
  };
}

}  // namespace nibble_cli
