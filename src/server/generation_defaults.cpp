// generation_config.json defaults (see generation_defaults.h).
#include "server/generation_defaults.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace megadecode {

GenerationDefaults load_generation_defaults(const std::filesystem::path& model_dir) {
  GenerationDefaults d;
  const auto path = model_dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return d;
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  MD_REQUIRE(!j.is_discarded() && j.is_object(), path.string(), ": not a JSON object");
  auto number = [&](const char* name) -> std::optional<float> {
    auto it = j.find(name);
    if (it == j.end() || it->is_null()) return std::nullopt;
    MD_REQUIRE(it->is_number(), path.string(), ": '", name, "' must be a number");
    return it->get<float>();
  };
  // do_sample false means greedy in transformers; vLLM still takes the given temperature. We keep
  // vLLM's rule: only the fields below matter.
  d.sampling.temperature = number("temperature");
  d.sampling.top_p = number("top_p");
  d.sampling.min_p = number("min_p");
  d.sampling.repetition_penalty = number("repetition_penalty");
  if (auto k = number("top_k")) d.sampling.top_k = static_cast<int>(*k);
  if (auto m = number("max_new_tokens")) d.max_new_tokens = static_cast<int>(*m);
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_number_integer()) {
      d.eos_token_ids.push_back(it->get<int32_t>());
    } else {
      MD_REQUIRE(it->is_array(), path.string(), ": 'eos_token_id' must be an integer or a list");
      for (const auto& x : *it) {
        MD_REQUIRE(x.is_number_integer(), path.string(), ": 'eos_token_id' must hold integers");
        d.eos_token_ids.push_back(x.get<int32_t>());
      }
    }
  }
  return d;
}

SamplingParams resolve_sampling(const SamplingFields& r, const SamplingFields& d) {
  SamplingParams p;  // OpenAI's defaults are SamplingParams' own
  auto resolve = [](auto& field, const auto& request, const auto& model) {
    field = request.value_or(model.value_or(field));
  };
  resolve(p.temperature, r.temperature, d.temperature);
  resolve(p.top_p, r.top_p, d.top_p);
  resolve(p.top_k, r.top_k, d.top_k);
  resolve(p.min_p, r.min_p, d.min_p);
  resolve(p.presence_penalty, r.presence_penalty, d.presence_penalty);
  resolve(p.frequency_penalty, r.frequency_penalty, d.frequency_penalty);
  resolve(p.repetition_penalty, r.repetition_penalty, d.repetition_penalty);
  return p;
}

}  // namespace megadecode
