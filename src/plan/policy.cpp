#include "plan/policy.h"

#include "core/check.h"

namespace megadecode {

std::vector<std::string> policy_names() { return {"default", "grid-sync", "long-splits", "router-after-attn", "equal-up-shares"}; }

Policy policy_by_name(const std::string& name) {
  Policy p;
  p.name = name;
  if (name == "default") return p;
  if (name == "grid-sync") {
    p.grid_sync = true;
    return p;
  }
  if (name == "router-after-attn") {
    p.router_after_attn = true;
    return p;
  }
  if (name == "equal-up-shares") {
    p.up_balance_tokens_per_unit = 0.0;
    return p;
  }
  if (name == "long-splits") {
    p.attn_min_split_tokens = 512;
    return p;
  }
  std::string known;
  for (const auto& n : policy_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(cat("unknown plan policy \"", name, "\" (known: ", known, ")"));
}

}  // namespace megadecode
