// Shared helpers of the tokenizer tests: the Qwen3 tokenizer loaded once from
// data/tokenizer/qwen3 (written by scripts/setup), the JavaScript references run through node,
// and printing strings with their bytes escaped.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/check.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_tables.h"

namespace megadecode::testing {

inline std::filesystem::path qwen3_dir() { return std::filesystem::path(MEGADECODE_SOURCE_DIR) / "data/tokenizer/qwen3"; }

inline const Tokenizer& qwen3() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    if (!std::filesystem::exists(qwen3_dir() / "tokenizer.json")) {
      ADD_FAILURE() << qwen3_dir() << " has no tokenizer.json: run scripts/setup";
    }
    return Tokenizer::load(qwen3_dir());
  }();
  return *tokenizer;
}

// Expects loading the model directory dir to fail with an error containing needle; removes dir.
inline void expect_load_error(const std::filesystem::path& dir, const std::string& needle) {
  try {
    Tokenizer::load(dir);
    ADD_FAILURE() << "loading " << dir << " should fail with \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// The string with control bytes, non-ASCII bytes and backslashes escaped, cut to max_bytes.
inline std::string escaped(const std::string& s, size_t max_bytes = 200) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_bytes; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b >= 0x20 && b < 0x7F && b != '\\') {
      out += static_cast<char>(b);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", b);
      out += buf;
    }
  }
  if (s.size() > max_bytes) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

// Runs `node scripts/SCRIPT [MODE] IN.json OUT.json [EXTRA_ARG]` with IN.json = input_text (JSON,
// dumped by the caller so that ordered keys keep their order); returns OUT.json parsed.
inline nlohmann::json run_node_reference(const std::string& script, const std::string& mode,
                                         const std::string& input_text, const std::string& extra_arg = "") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("megadecode-ref-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string stem = mode.empty() ? std::string("chat") : mode;
  const fs::path in = dir / (stem + "-in.json"), out = dir / (stem + "-out.json"), err = dir / (stem + "-err.txt");
  std::ofstream(in) << input_text;
  const std::string path = std::string(MEGADECODE_SOURCE_DIR) + "/scripts/" + script;
  const std::string extra = extra_arg.empty() ? std::string() : " '" + extra_arg + "'";
  const std::string cmd = "node '" + path + "' " + mode + " '" + in.string() + "' '" + out.string() + "'" + extra +
                          " 2>'" + err.string() + "'";
  const int rc = std::system(cmd.c_str());
  std::stringstream err_text, out_text;
  err_text << std::ifstream(err).rdbuf();
  if (rc != 0) {
    fs::remove_all(dir);
    throw Error("the JavaScript reference failed (is node installed? run scripts/setup): " + cmd + "\n" +
                err_text.str());
  }
  out_text << std::ifstream(out).rdbuf();
  fs::remove_all(dir);
  return nlohmann::json::parse(out_text.str());
}

// Runs scripts/tokenizer_reference.mjs MODE on inputs, with the Qwen3 tokenizer or the one in
// model_dir; returns its "results" array.
inline nlohmann::json run_reference(const std::string& mode, const nlohmann::json& inputs,
                                    const std::filesystem::path& model_dir = {}) {
  nlohmann::json result = run_node_reference("tokenizer_reference.mjs", mode, inputs.dump(), model_dir.string());
  // Our Unicode tables come from Node; a different Node may classify new characters differently.
  EXPECT_EQ(result["unicode"].get<std::string>(), unicode::kUnicodeVersion)
      << "node's Unicode version differs from src/tokenizer/unicode_tables.cpp: regenerate it with "
         "node scripts/gen_unicode_tables.mjs > src/tokenizer/unicode_tables.cpp";
  return result["results"];
}

}  // namespace megadecode::testing
