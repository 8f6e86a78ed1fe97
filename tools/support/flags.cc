#include "support/flags.h"

#include <cctype>
#include <vector>

#include "support/text.h"

namespace nibble_cli {

CLI::Option* AddThreadsOption(CLI::App* cmd, int* threads, const std::string& help) {
  return cmd->add_option("--threads,-t", *threads, help)->capture_default_str()->check(CLI::Range(0, nibble::kMaxThreads));
}

namespace {

// The known flag a mistyped one most likely meant: the closest by edit distance, else a known
// flag it starts with ("--model_dir_x" -> "--model_dir") or one that starts with it ("--model" ->
// "--model_dir"). "" when none is near.
std::string FlagHint(const std::string& flag, const std::vector<std::string>& known) {
  if (std::string best = ClosestOf(flag, known); !best.empty()) return best;
  auto word_boundary = [](const std::string& longer, size_t at) {
    return !std::isalnum(static_cast<unsigned char>(longer[at]));
  };
  for (const std::string& k : known)
    if (flag.size() > k.size() && flag.starts_with(k) && word_boundary(flag, k.size())) return k;
  for (const std::string& k : known)
    if (k.size() > flag.size() && flag.size() > 3 && k.starts_with(flag) && word_boundary(k, flag.size())) return k;
  return "";
}

}  // namespace

std::string UnknownFlags(const CLI::App& app, const std::string& command) {
  std::vector<std::string> known;
  for (const CLI::Option* o : app.get_options())
    for (const std::string& l : o->get_lnames()) known.push_back("--" + l);
  std::string msg;
  for (const std::string& arg : app.remaining()) {
    if (arg.size() < 2 || arg[0] != '-') continue;
    const std::string flag = arg.substr(0, arg.find('='));
    msg += (msg.empty() ? "" : "; ") + std::string("unknown option ") + flag;
    if (const std::string hint = FlagHint(flag, known); !hint.empty()) msg += " (did you mean " + hint + "?)";
  }
  return msg.empty() ? msg : command + ": " + msg + " (see nibble " + command + " --help)";
}

}  // namespace nibble_cli
