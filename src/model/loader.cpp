// Opening a model: config, checkpoint, binding (from disk), or config and synthetic tensors (in memory).
#include "model/loader.h"

#include "model/presets.h"
#include "model/synthetic.h"

namespace megadecode {

LoadedModel load_model(const std::filesystem::path& model_dir) {
  LoadedModel m;
  m.config = load_model_config(model_dir);
  m.checkpoint = std::make_unique<Checkpoint>(Checkpoint::open(model_dir));
  m.weights = bind_weights(m.config, m.checkpoint->tensors());
  return m;
}

LoadedModel synthetic_model(const ModelConfig& config, uint64_t seed) {
  LoadedModel m;
  m.config = config;
  m.store = make_synthetic_tensors(config, seed);
  m.weights = bind_weights(m.config, m.store->tensors());
  return m;
}

LoadedModel synthetic_model(const std::string& preset, uint64_t seed) { return synthetic_model(preset_config(preset), seed); }

}  // namespace megadecode
