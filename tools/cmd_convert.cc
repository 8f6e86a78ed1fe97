// `nibble convert --in DIR --out DIR --to FORMAT`: a quantized checkpoint re-written in another
// format without re-quantizing (codes, zero points and scales carried over).
#include <cstdio>
#include <memory>
#include <string>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/cancel_signal.h"

namespace nibble_cli {

Runner RegisterConvert(CLI::App& app) {
  auto r = std::make_shared<nibble::ConvertRequest>();
  CLI::App* cmd = app.add_subcommand("convert", "Re-write a quantized checkpoint in another format, codes untouched");
  cmd->add_option("--in,--model,--model_dir", r->input_dir, "Quantized checkpoint directory (hf_format, compressed-tensors, awq, gptq)")->required();
  cmd->add_option("--out,--output_dir", r->output_dir, "Output directory (written staged, renamed when complete)")->required();
  cmd->add_option("--to", r->to, "Target format: hf_format (quark) | compressed-tensors | awq | gptq")->required();
  cmd->add_option("--pack_method", r->pack_method, "hf_format nibble order: reorder | order (default: the input's, else reorder)");
  cmd->add_option("--gptq_format", r->gptq_format, "gptq zero points: v1 | v2 (default v1)");
  cmd->add_flag("--overwrite", r->overwrite, "Replace an existing output directory");
  return [r]() -> int {
    r->on_message = [](const std::string& m) { std::fprintf(stderr, "%s\n", m.c_str()); };
    const CancelOnSignal interrupt;  // Ctrl-C: nothing written, exit 130
    r->cancel = interrupt.token();
    auto s = nibble::Convert(*r);
    if (!s.ok()) return FailStatus(s.error());
    std::printf("converted %s (%s) -> %s (%s): %lld quantized linears re-packed, %lld tensors copied, %lld shard(s), %.1f s\n",
                r->input_dir.c_str(), s->from.c_str(), r->output_dir.c_str(), s->to.c_str(),
                static_cast<long long>(s->quantized_linears), static_cast<long long>(s->float_tensors),
                static_cast<long long>(s->shards), s->seconds);
    return 0;
  };
}

}  // namespace nibble_cli
