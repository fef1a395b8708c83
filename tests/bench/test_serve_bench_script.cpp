// scripts/serve_bench end to end on the CPU: two CPU backends serving the tiny preset with random
// weights, every scenario at tiny lengths plus the decode-stall run; the merged JSON must hold
// every record and key with sane values, the markdown table the ratio rows, and no server may
// outlive the script. The servers run without a tokenizer (--skip-tokenizer-init), so no
// tokenizer files are needed: random weights always, a model directory without tokenizer.json.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

namespace megadecode {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kRoot = MEGADECODE_SOURCE_DIR;
fs::path megadecode_binary() { return fs::read_symlink("/proc/self/exe").parent_path() / "megadecode"; }
const fs::path kScript = kRoot / "scripts/serve_bench";

std::string quoted(const fs::path& p) {  // for sh; our paths hold no quote
  std::string s(1, '\'');
  s += p.string();
  s += '\'';
  return s;
}

std::pair<int, std::string> run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, out};
  std::array<char, 4096> buf{};
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Scenario specs "IN OUT CONCURRENCY PROMPTS" for the CPU run.
const std::map<std::string, std::array<int, 4>> kSpecs = {
    {"a", {24, 6, 1, 2}}, {"b", {24, 5, 4, 4}}, {"c", {80, 5, 4, 4}}, {"d", {8, 10, 6, 6}}, {"e", {30, 5, 8, 6}},
    {"f", {8, 6, 12, 12}}};
const std::vector<std::string> kBackends = {"cpu-mk", "cpu-ref"};

class ServeBenchScript : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(megadecode_binary())) << megadecode_binary() << " is not built";
    dir_ = fs::temp_directory_path() / ("serve_bench_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string command(const std::string& extra_env) const {
    std::string env = "MEGADECODE=" + quoted(megadecode_binary()) + " BACKENDS='cpu-mk cpu-ref' PRESET=tiny " +
                      "SERVE_FLAGS='--threads 2 --max-num-batched-tokens 32 --kv-cache-tokens 8192' " +
                      "OUT_JSON=" + quoted(dir_ / "serve.json") + " RAW_DIR=" + quoted(dir_ / "raw") + " " +
                      "HEALTH_TIMEOUT=120 STOP_TIMEOUT=20 BUDGET_S=400";
    for (const auto& [name, s] : kSpecs)
      env += " SCENARIO_" + name + "='" + std::to_string(s[0]) + " " + std::to_string(s[1]) + " " +
             std::to_string(s[2]) + " " + std::to_string(s[3]) + "'";
    return env + " " + extra_env + " " + quoted(kScript) + " 2>&1";
  }

  fs::path dir_;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

constexpr const char* kTokenIdServer = "as token ids (--skip-tokenizer-init)";  // the server's start-up line

TEST_F(ServeBenchScript, EstimateOnlyRunsNothing) {
  auto [rc, out] = run(command("ESTIMATE_ONLY=1"));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("serve_bench: estimate ~"), std::string::npos) << out;
  EXPECT_NE(out.find("e: 6 prompts, 30 in / 5 out, concurrency 8 (Poisson, ~8 running): ~1 s per backend"),
            std::string::npos)
      << out;
  // The default H200 plan: c is 8 x 8192 prompt tokens at 2000 tok/s and 256 steps of ~15.6 ms
  // (interpolated at batch 8): 32.8 + 4.0 + 1 s.
  const std::string script = quoted(kScript);
  auto [rc2, out2] = run("ESTIMATE_ONLY=1 BACKENDS=x SCENARIOS='a b c d e stall' " + script + " 2>&1");
  EXPECT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("  c: 8 prompts, 8192 in / 256 out, concurrency 8 (all at once): ~37 s per backend"),
            std::string::npos)
      << out2;
  EXPECT_EQ(out2.find("over the budget"), std::string::npos) << out2;
  auto [rc4, out4] = run("ESTIMATE_ONLY=1 EST_PREFILL_TOK_S=125 " + script + " 2>&1");
  EXPECT_EQ(rc4, 0) << out4;
  EXPECT_NE(out4.find("over the budget"), std::string::npos) << out4;
  auto [rc3, out3] = run(command("ESTIMATE_ONLY=1 EST_PREFILL_TOK_S=0"));
  EXPECT_EQ(rc3, 2) << out3;
  EXPECT_FALSE(fs::exists(dir_ / "serve.json"));
}

TEST_F(ServeBenchScript, RejectsBadScenarios) {
  auto [rc, out] = run(command("SCENARIOS='a z'"));
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("unknown scenario \"z\""), std::string::npos) << out;
  auto [rc2, out2] = run(command("SCENARIO_a='24 x 1 2' SCENARIOS=a"));
  EXPECT_EQ(rc2, 2) << out2;
}

// PAIRED_WITH replays a constrained run's lengths (bench serve --output-lens, tested there): it must
// name a folder, not come with RESPONSE_FORMAT, and not be this run's own raw folder (emptied first).
TEST_F(ServeBenchScript, RejectsABadPairing) {
  auto [rc, out] = run(command("SCENARIOS=d PAIRED_WITH=" + quoted(dir_ / "no-such-folder")));
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("PAIRED_WITH must be the raw folder"), std::string::npos) << out;
  fs::create_directories(dir_ / "raw");
  auto [rc2, out2] = run(command("SCENARIOS=d RESPONSE_FORMAT=json_object PAIRED_WITH=" + quoted(dir_ / "raw")));
  EXPECT_EQ(rc2, 2) << out2;
  EXPECT_NE(out2.find("unset RESPONSE_FORMAT"), std::string::npos) << out2;
  auto [rc3, out3] = run(command("SCENARIOS=d PAIRED_WITH=" + quoted(dir_ / "raw")));
  EXPECT_EQ(rc3, 2) << out3;
  EXPECT_NE(out3.find("this run's own raw folder"), std::string::npos) << out3;
  EXPECT_FALSE(fs::exists(dir_ / "serve.json"));
}

TEST_F(ServeBenchScript, AFailedBackendIsReportedAndTheReportStillWritten) {
  auto [rc, out] = run(command("BACKENDS='cpu-ref no-such-backend' SCENARIOS=a"));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("the no-such-backend server exited during start-up"), std::string::npos) << out;
  EXPECT_NE(out.find("unknown backend \"no-such-backend\""), std::string::npos) << out;
  std::ifstream in(dir_ / "serve.json");
  const json j = json::parse(in);
  EXPECT_EQ(j["records"].size(), 1u);
  EXPECT_EQ(j["missing"], json({"no-such-backend/a"}));
  EXPECT_TRUE(j["ratios"].empty());
}

TEST_F(ServeBenchScript, RunsEveryScenarioOnTwoBackends) {
  auto [rc, out] = run(command(
      "SCENARIOS='a b c d e f g stall' STALL_STREAMS=3 STALL_IN=8 STALL_OUT=600 STALL_LONG=200 STALL_BEFORE=3 "
      "AGENT_CONVS=2 AGENT_TURNS=3 AGENT_PREFIX=40 AGENT_APPEND='5 9' AGENT_OUT=4"));
  std::printf("%s\n", out.c_str());
  ASSERT_EQ(rc, 0) << out;
  std::ifstream in(dir_ / "serve.json");
  const json j = json::parse(in);
  EXPECT_EQ(j["preset"], "tiny");
  EXPECT_EQ(j["backends"], json(kBackends));
  EXPECT_TRUE(j["missing"].empty()) << j["missing"];
  EXPECT_NE(j["command"].get<std::string>().find("scripts/serve_bench"), std::string::npos);
  EXPECT_EQ(j["serve_flags"].get<std::string>().rfind(
                "--max-num-seqs 256 (cuda-mk, cuda-ops: at most 64) --skip-tokenizer-init --threads 2", 0),
            0u)
      << j["serve_flags"];

  std::set<std::pair<std::string, std::string>> seen;
  for (const json& r : j["records"]) {
    const std::string s = r["scenario"], b = r["backend"];
    SCOPED_TRACE(b + "/" + s);
    ASSERT_TRUE(kSpecs.count(s)) << s;
    EXPECT_TRUE(seen.insert({b, s}).second) << "duplicate record";
    const auto& spec = kSpecs.at(s);
    EXPECT_EQ(r["input_len"], spec[0]);
    EXPECT_EQ(r["output_len"], spec[1]);
    EXPECT_EQ(r["concurrency"], spec[2]);
    EXPECT_EQ(r["num_prompts"], spec[3]);
    EXPECT_EQ(r["completed"], spec[3]);
    EXPECT_EQ(r["failed"], 0);
    for (const char* k : {"ttft_ms_p50", "tpot_ms_mean", "itl_ms_p99", "output_tok_s", "decode_tok_s_per_request",
                          "mean_running", "e2el_ms_mean", "duration_s"})
      EXPECT_GT(r[k].get<double>(), 0.0) << k;
    // Little's law cannot put more requests in flight than the concurrency allowed.
    EXPECT_LE(r["mean_running"].get<double>(), std::min(spec[2], spec[3]) * 1.05);
    // TPOT and the decode rate measure the same gaps: 1000 / mean TPOT <= mean rate (Jensen).
    EXPECT_LE(1000.0 / r["tpot_ms_mean"].get<double>(), r["decode_tok_s_per_request"].get<double>() * 1.0001);
    if (s == "e") {
      EXPECT_TRUE(r["request_rate"].is_number()) << r["request_rate"];
    } else {
      EXPECT_EQ(r["request_rate"], "inf");
    }
  }
  EXPECT_EQ(seen.size(), kSpecs.size() * kBackends.size());

  ASSERT_EQ(j["ratios"].size(), kSpecs.size());
  for (const json& q : j["ratios"]) {
    EXPECT_EQ(q["numerator"], "cpu-mk");
    EXPECT_EQ(q["denominator"], "cpu-ref");
    EXPECT_GT(q["decode_tok_s_per_request"].get<double>(), 0.0);
  }
  ASSERT_EQ(j["decode_stall"].size(), kBackends.size());
  for (const json& s : j["decode_stall"]) {
    SCOPED_TRACE(s["backend"].get<std::string>());
    EXPECT_TRUE(s["complete"].get<bool>()) << s["error"];
    EXPECT_EQ(s["background_streams"], 3);
    EXPECT_EQ(s["long_prompt_len"], 200);
    EXPECT_GT(s["long_ttft_ms"].get<double>(), 0.0);
    EXPECT_GE(s["before"]["samples"].get<int>(), 3 * 2);
    EXPECT_GE(s["during"]["samples"].get<int>(), 3);
    EXPECT_LE(s["during"]["itl_ms_p99"].get<double>(), s["during"]["itl_ms_max"].get<double>());
  }

  ASSERT_EQ(j["agent"].size(), kBackends.size());
  for (const json& a : j["agent"]) {
    SCOPED_TRACE(a["backend"].get<std::string>());
    EXPECT_TRUE(a["complete"].get<bool>()) << a["error"];
    EXPECT_EQ(a["conversations"], 2);
    EXPECT_EQ(a["turns"], 3);
    EXPECT_EQ(a["output_tokens"], 2 * 3 * 4);
    EXPECT_GT(a["prefix_cache_hit_rate"].get<double>(), 0.3);  // later turns re-send the history (token ids back)
    EXPECT_GT(a["ttft_ms_p50"].get<double>(), 0.0);
  }

  std::ifstream md_in(dir_ / "serve.md");
  const std::string md((std::istreambuf_iterator<char>(md_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(md.find("| scenario | cpu-mk / cpu-ref: decode tok/s per request |"), std::string::npos) << md;
  for (const auto& [name, spec] : kSpecs) EXPECT_NE(md.find("\n| " + name + " | cpu-mk | "), std::string::npos) << name;
  EXPECT_NE(md.find("| cpu-ref | 3 | 200 | "), std::string::npos) << md;
  EXPECT_NE(md.find("| cpu-mk | 2 x 3 | 40 | 5-9 / 4 | "), std::string::npos) << md;

  // The servers ran without a tokenizer and are gone: their logs say they shut down on the signal.
  for (const std::string& b : kBackends) {
    const std::string text = read_text(dir_ / "raw" / (b + ".server.log"));
    EXPECT_NE(text.find(kTokenIdServer), std::string::npos) << b << ":\n" << text;
    EXPECT_NE(text.find("signal 15: draining"), std::string::npos) << b << ":\n" << text;
    EXPECT_NE(text.find("] shut down"), std::string::npos) << b << ":\n" << text;
  }
}

TEST_F(ServeBenchScript, AModelDirectoryWithoutTokenizerIsServedAsTokenIds) {
  const fs::path model = dir_ / "tiny-no-tokenizer";
  auto [rc_make, out_make] = run(quoted(megadecode_binary()) + " make-model --preset tiny --seed 0 --no-tokenizer" +
                                 " --out " + quoted(model) + " 2>&1");
  ASSERT_EQ(rc_make, 0) << out_make;
  ASSERT_FALSE(fs::exists(model / "tokenizer.json"));
  auto [rc, out] = run(command("MODEL_DIR=" + quoted(model) + " BACKENDS=cpu-ref SCENARIOS=a"));
  ASSERT_EQ(rc, 0) << out;
  std::ifstream in(dir_ / "serve.json");
  const json j = json::parse(in);
  ASSERT_EQ(j["records"].size(), 1u) << j.dump();
  EXPECT_EQ(j["records"][0]["completed"], kSpecs.at("a")[3]);
  EXPECT_EQ(j["records"][0]["failed"], 0);
  EXPECT_GT(j["records"][0]["itl_ms_p99"].get<double>(), 0.0);
  const std::string log = read_text(dir_ / "raw" / "cpu-ref.server.log");
  EXPECT_NE(log.find("loading " + model.string()), std::string::npos) << log;
  EXPECT_NE(log.find(kTokenIdServer), std::string::npos) << log;
}

}  // namespace
}  // namespace megadecode
