// Private definition of nibble::Model::Impl (shared by the src/api/ translation units).
#pragma once

#include <memory>

#include <nibble/nibble.h>

#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace nibble {

struct Model::Impl {
  ModelInfo info;
  std::unique_ptr<LlamaModel> llama;
  std::unique_ptr<Tokenizer> tokenizer;
};

}  // namespace nibble
