// `nibble tokenize`: the token ids (a JSON array) or vocabulary pieces of a text, as llama.cpp's
// llama-tokenize prints them. Needs only the tokenizer files of the model directory.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <nibble/tokenizer.h>

#include "commands.h"

namespace nibble_cli {

namespace {

struct TokenizeArgs {
  std::string model, text, file;
  bool ids = false, pieces = false, no_bos = false, time = false;
  nibble::TokenizerType tokenizer = nibble::TokenizerType::kAuto;
};

int RunTokenize(const TokenizeArgs& a) {
  std::string text = a.text;
  if (!a.file.empty()) {
    if (const std::string err = ReadTextFile(a.file, &text); !err.empty()) return Fail("--file: " + err);
  }
  auto tok = nibble::TextTokenizer::Load(a.model, a.tokenizer);
  if (!tok.ok()) return Fail(tok.error().message);
  const auto t0 = std::chrono::steady_clock::now();
  auto ids = (*tok)->Encode(text, !a.no_bos);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!ids.ok()) return Fail((a.file.empty() ? std::string("--text: ") : "--file " + a.file + ": ") + ids.error().message);
  std::string out = "[";
  for (size_t i = 0; i < ids->size(); ++i) {
    if (i > 0) out += ", ";
    const int32_t id = (*ids)[i];
    out += a.pieces ? nlohmann::json((*tok)->Piece(id)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                    : std::to_string(id);
  }
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (a.time)
    std::fprintf(stderr, "encode: %zu bytes, %zu tokens in %.4f s (%.2f MB/s, %s)\n", text.size(), ids->size(), seconds,
                 seconds > 0 ? static_cast<double>(text.size()) / seconds / 1e6 : 0.0, (*tok)->kind());
  return 0;
}

}  // namespace

Runner RegisterTokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids (a JSON array) or pieces of a text");
  cmd->add_option("--model,-m,--model_dir", a->model, "Model directory (only its tokenizer files are read)")->required();
  CLI::Option* text = cmd->add_option("--text,-p", a->text, "Text to tokenize");
  CLI::Option* file = cmd->add_option("--file,-f", a->file, "Tokenize this file's contents (as they are)")->excludes(text);
  text->excludes(file);
  CLI::Option* ids = cmd->add_flag("--ids", a->ids, "Print token ids as a JSON array (the default)");
  cmd->add_flag("--pieces", a->pieces, "Print the vocabulary pieces as a JSON array of strings")->excludes(ids);
  cmd->add_flag("--no_bos", a->no_bos, "Add no special tokens (BOS / EOS) to the text");
  cmd->add_flag("--time", a->time, "Print the encoding time and MB/s on stderr (loading not included)");
  AddTokenizerOption(cmd, &a->tokenizer);
  return [a, text, file]() {
    if (text->count() == 0 && file->count() == 0) return UsageError("tokenize: give --text STRING or --file FILE");
    return RunTokenize(*a);
  };
}

}  // namespace nibble_cli
