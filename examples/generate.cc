// A program on nibble's C++ API (include/nibble/): loads a model directory, tokenizes a prompt and
// generates greedily. Build it against an installed nibble (examples/CMakeLists.txt, or
// pkg-config: g++ generate.cc $(pkg-config --cflags --libs nibble)); run: generate MODEL_DIR [PROMPT].
#include <cstdio>
#include <string>

#include <nibble/nibble.h>

int main(int argc, char** argv) {
  if (argc < 2) return std::fprintf(stderr, "usage: %s MODEL_DIR [PROMPT]\n", argv[0]), 2;
  auto model = nibble::Model::Load(argv[1]);
  if (!model.ok()) return std::fprintf(stderr, "error: %s\n", model.error().message.c_str()), 1;
  nibble::GenerateOptions opt;
  opt.prompt = argc > 2 ? argv[2] : "Once upon a time";
  opt.max_new_tokens = 16;
  opt.sampling.temperature = 0;  // greedy
  auto ids = (*model)->Tokenize(opt.prompt);
  if (!ids.ok()) return std::fprintf(stderr, "error: %s\n", ids.error().message.c_str()), 1;
  std::printf("prompt tokens:");
  for (int32_t id : *ids) std::printf(" %d", id);
  std::printf("\n%s", opt.prompt.c_str());
  auto stats = nibble::Generate(**model, opt, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    return true;
  });
  if (!stats.ok()) return std::fprintf(stderr, "\nerror: %s\n", stats.error().message.c_str()), 1;
  std::printf("\n");
  return 0;
}
