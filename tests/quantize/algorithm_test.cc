// The algorithm registry (quantize/algorithm.h): a --quant_algo chain is read against the table
// (unknown names, repeats and the order named in the error), resolved once with each algorithm's
// settings (flags, its algo_config entry over them), and every consumer's view of the run (name,
// label, card line, propagation, algo_config, report sections) comes from that plan.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nibble/nibble.h>
#include <nlohmann/json.hpp>

#include "quantize/algorithm.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

nibble::Result<nibble::AlgorithmPlan> ResolveChain(const std::string& text, const nibble::AlgorithmFlags& flags = {},
                                              const nlohmann::ordered_json& algo_config = nullptr) {
  NIBBLE_ASSIGN_OR_RETURN(auto chain, nibble::ParseAlgorithmChain(text));
  return nibble::ResolveAlgorithms(chain, flags, algo_config);
}

// The error of parsing `text`, or a failure when it parses.
std::string ChainError(const std::string& text) {
  auto r = nibble::ParseAlgorithmChain(text);
  EXPECT_FALSE(r.ok()) << text << " was accepted";
  return r.ok() ? "" : r.error().message;
}

TEST(QuantAlgorithmRegistry, AnUnknownNameInAChainIsNamedWithTheKnownOnes) {
  for (const char* text : {"gtpq", "awq,gtpq", "gtpq+gptq"}) {
    auto r = nibble::ParseAlgorithmChain(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.error().code, nibble::ErrorCode::kUnsupported) << text;
    EXPECT_NE(r.error().message.find("unknown algorithm \"gtpq\""), std::string::npos) << r.error().message;
    for (const nibble::QuantAlgorithm& a : nibble::QuantAlgorithms())
      EXPECT_NE(r.error().message.find(a.name), std::string::npos) << a.name << " missing in: " << r.error().message;
  }
  EXPECT_NE(ChainError("awq,").find("empty algorithm name"), std::string::npos);
  EXPECT_NE(ChainError("").find("empty algorithm name"), std::string::npos);
  // The public check and the run say the same, before anything is read or written.
  auto d = nibble::DescribeQuantAlgo("awq,gtpq");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("unknown algorithm \"gtpq\""), std::string::npos) << d.error().message;
  nibble_test::TempDir tmp;
  nibble::QuantizeRequest req;
  req.model_dir = nibble_test::EmbeddedModel();
  req.output_dir = tmp.sub("never");
  req.quant_algo = "awq,gtpq";
  auto q = nibble::Quantize(req);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.error().message.rfind("--quant_algo \"awq,gtpq\": unknown algorithm \"gtpq\" (known: rtn, awq, gptq", 0), 0u)
      << q.error().message;
  EXPECT_FALSE(std::filesystem::exists(tmp.sub("never")));
  // Calibration sizes out of range are refused for RTN too (which reads neither).
  req.quant_algo = "rtn";
  req.num_calib_data = -3;
  q = nibble::Quantize(req);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.error().message, "--num_calib_data -3 must be at least 1");
  req.num_calib_data = 4;
  req.seq_len = 0;
  q = nibble::Quantize(req);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.error().message, "--seq_len 0 must be at least 1");
  EXPECT_FALSE(std::filesystem::exists(tmp.sub("never")));
}

TEST(QuantAlgorithmRegistry, ChainOrderAndRepeatsAreValidated) {
  EXPECT_NE(ChainError("awq,awq").find("awq appears twice"), std::string::npos);
  EXPECT_NE(ChainError("gptq,awq,gptq").find("gptq appears twice"), std::string::npos);
  // Smoothing changes the weights the rounding algorithm quantizes: it runs first.
  const std::string order = ChainError("gptq,awq");
  EXPECT_NE(order.find("awq changes the float weights, so it runs before gptq"), std::string::npos) << order;
  EXPECT_NE(order.find("(use awq,gptq)"), std::string::npos) << order;
  // RTN is what a chain's unrounded linears get anyway: it stands alone.
  EXPECT_NE(ChainError("awq,rtn").find("rtn runs alone"), std::string::npos);
  EXPECT_NE(ChainError("rtn,gptq").find("(use gptq)"), std::string::npos);

  auto ok = nibble::ParseAlgorithmChain("awq+gptq");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_STREQ((*ok)[0]->name, "awq");
  EXPECT_STREQ((*ok)[1]->name, "gptq");
  auto d = nibble::DescribeQuantAlgo("awq+gptq");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->name, "awq,gptq");
  EXPECT_EQ(d->label, "AWQ+GPTQ");
  EXPECT_TRUE(d->calibrated);
  d = nibble::DescribeQuantAlgo("rtn");
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->calibrated);
}

TEST(QuantAlgorithmRegistry, ThePlanCarriesEachAlgorithmsSettingsAsTheyRun) {
  auto rtn = ResolveChain("rtn");
  ASSERT_TRUE(rtn.ok());
  EXPECT_FALSE(rtn->Calibrated());
  EXPECT_EQ(rtn->CardLine(), "RTN (round to nearest)");
  // Without --propagate, the chain's last algorithm decides, for every algorithm of the chain.
  auto awq = ResolveChain("awq");
  ASSERT_TRUE(awq.ok());
  EXPECT_EQ(awq->propagation(), nibble::Propagation::kFp);
  auto chain = ResolveChain("awq,gptq");
  ASSERT_TRUE(chain.ok()) << chain.error().message;
  EXPECT_EQ(chain->propagation(), nibble::Propagation::kQuantized);
  EXPECT_EQ(chain->Label(), "AWQ+GPTQ");
  EXPECT_EQ(chain->CardLine(), "AWQ scaling, then GPTQ rounding");
  const nibble::CalibResult run;
  const nibble::ModelConfig mc;
  nlohmann::ordered_json algo = chain->AlgoConfig(run, mc);
  ASSERT_EQ(algo.size(), 2u);
  EXPECT_EQ(algo[0]["name"], "awq");
  EXPECT_EQ(algo[0]["propagation"], "quantized");
  EXPECT_EQ(algo[1]["name"], "gptq");

  // An algo_config entry overrides its algorithm's flags key by key; the report says what runs.
  nibble::AlgorithmFlags flags;
  flags.gptq.block_size = 64;
  const auto cfg = nlohmann::ordered_json::parse(R"([{"name": "gptq", "damp_percent": 0.05}])");
  auto g = ResolveChain("gptq", flags, cfg);
  ASSERT_TRUE(g.ok()) << g.error().message;
  const nlohmann::ordered_json rep = g->ReportJson(run);
  EXPECT_EQ(rep["gptq"]["dampening_frac"], 0.05);
  EXPECT_EQ(rep["gptq"]["block_size"], 64);
  EXPECT_FALSE(rep.contains("awq"));

  // Validation names the setting as the user gave it: the algo_config key, else the flag.
  auto bad = ResolveChain("gptq", flags, nlohmann::ordered_json::parse(R"([{"name": "rtn"}, {"name": "gptq", "damp_percent": 1.5}])"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("algo_config[1].damp_percent 1.5", 0), 0u) << bad.error().message;
  flags.gptq.dampening_frac = 0;
  bad = ResolveChain("gptq", flags);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("--dampening_frac 0", 0), 0u) << bad.error().message;
  // A flag of an algorithm outside the chain that would change the run is refused; the others are
  // still checked.
  bad = ResolveChain("awq", flags);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("--dampening_frac 0", 0), 0u) << bad.error().message;
  nibble::AlgorithmFlags actorder;
  actorder.gptq.actorder = nibble::GptqActOrder::kStatic;
  bad = ResolveChain("awq", actorder);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("--actorder static is a GPTQ setting; --quant_algo awq does not use it"),
            std::string::npos)
      << bad.error().message;
  nibble::AlgorithmFlags grid;
  grid.awq.n_grid = 3;
  grid.awq.duo_scaling = nibble::DuoScaling::kBoth;
  bad = ResolveChain("awq", grid);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "--n_grid 3 is too small (at least 2; 4 with --duo_scaling both)");
  bad = ResolveChain("awq", grid, nlohmann::ordered_json::parse(R"({"name": "awq", "n_grid": 1})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("algo_config[0].n_grid 1 is too small", 0), 0u) << bad.error().message;
}

}  // namespace
