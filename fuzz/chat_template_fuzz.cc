// Fuzz target: chat template parsing and rendering on arbitrary template text with a fixed
// conversation. Properties: no crash, no hang (small step / output limits), every failure is an
// Error naming a position, never an escaped exception.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json kMessages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <there> & \"you\"\n"},
    {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello."},
    {"role": "user", "content": "Bye ünïcödé 👋"}])");
  nibble::chat::ChatTemplateSource t;
  t.source.assign(reinterpret_cast<const char*>(data), size);
  t.bos_token = "<s>";
  t.eos_token = "</s>";
  t.origin = "fuzz";
  nibble::chat::ChatRenderOptions o;
  o.add_generation_prompt = size % 2 == 0;
  o.extra_vars = {{"tools", nlohmann::ordered_json::array({{{"name", "f"}, {"parameters", {{"x", 1}}}}})}, {"flag", true}};
  o.now = 0;
  o.limits.max_steps = 200000;
  o.limits.max_output = size_t{1} << 20;
  o.limits.max_call_depth = 16;
  (void)nibble::chat::CheckChatTemplate(t.source, t.origin);
  (void)nibble::chat::RenderChat(t, kMessages, o);
  return 0;
}
