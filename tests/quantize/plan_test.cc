// The quantize plan is resolved once and every consumer reads it: for the README's flag
// combinations and each export format, what the summary reports per linear (the plan) is what the
// written checkpoint means when read back by its own format (QuantizedFormat::Resolve, as the
// loader reads it), and nibble's column of the engines report agrees with the file.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <nibble/nibble.h>

#include "formats/checkpoint_format.h"
#include "formats/quant_spec.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

struct Case {
  std::string name;
  std::vector<std::string> formats;
  std::function<void(nibble::QuantizeRequest&)> flags;
};

void ExpectWrittenAsPlanned(const nibble::QuantizeRequest& r, const std::string& what) {
  auto q = nibble::Quantize(r);
  ASSERT_TRUE(q.ok()) << what << ": " << q.error().message;
  auto fmt = nibble::OpenCheckpointFormat(r.output_dir);
  ASSERT_TRUE(fmt.ok() && *fmt) << what;
  int64_t quantized = 0;
  for (const auto& l : q->layers) {
    auto read = (*fmt)->Resolve(l.name);
    ASSERT_TRUE(read.ok()) << what << " " << l.name << ": " << read.error().message;
    EXPECT_EQ(l.quantized, read->spec.has_value()) << what << " " << l.name << " (" << l.rule << ")";
    if (l.quantized && read->spec) {
      EXPECT_EQ(l.scheme, nibble::DescribeSpec(*read->spec)) << what << " " << l.name;
      ++quantized;
    }
  }
  EXPECT_GT(quantized, 0) << what;
  auto inspect = nibble::Inspect(r.output_dir);
  ASSERT_TRUE(inspect.ok()) << what << ": " << inspect.error().message;
  ASSERT_FALSE(inspect->engine_rows.empty()) << what;
  for (const auto& row : inspect->engine_rows) EXPECT_TRUE(row.agrees.at(0)) << what << " " << row.name;
}

TEST(QuantizePlan, EveryWriterWritesWhatThePlanDecided) {
  nibble_test::TempDir tmp;
  const std::vector<std::string> all = {"hf_format", "compressed-tensors", "gptq", "awq"};
  const std::vector<Case> cases = {
      {"default", all, [](nibble::QuantizeRequest&) {}},
      {"lm_head quantized", {"hf_format", "compressed-tensors", "gptq"}, [](nibble::QuantizeRequest& r) {
         r.exclude_layers = {""};
         r.exclude_layers_given = true;
       }},
      {"down_proj g64", {"hf_format", "compressed-tensors", "gptq"},
       [](nibble::QuantizeRequest& r) { r.layer_quant_config = {"*down_proj:group_size=64"}; }},
      {"misaligned per_channel", {"hf_format", "compressed-tensors", "gptq"}, [](nibble::QuantizeRequest& r) {
         r.group_size = 96;
         r.misaligned = "per_channel";
       }},
      {"misaligned exclude, sym", {"hf_format", "compressed-tensors", "gptq"}, [](nibble::QuantizeRequest& r) {
         r.group_size = 96;
         r.misaligned = "exclude";
         r.quant_scheme = "w_int4_per_group_sym";
       }},
  };
  int n = 0;
  for (const Case& c : cases) {
    for (const std::string& f : c.formats) {
      nibble::QuantizeRequest r;
      r.model_dir = nibble_test::EmbeddedModel();
      r.output_dir = tmp.sub("out" + std::to_string(n++));
      r.model_export = f;
      c.flags(r);
      ExpectWrittenAsPlanned(r, c.name + " as " + f);
    }
  }
}

}  // namespace
