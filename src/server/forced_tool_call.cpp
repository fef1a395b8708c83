#include "server/forced_tool_call.h"

#include "core/check.h"

namespace megadecode {

std::vector<ForcedTool> forced_tools(const ToolChoice& choice, const RequestJson& tools) {
  std::vector<ForcedTool> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    const RequestJson& fn = tools[i].at("function");
    const std::string name = fn.at("name").get<std::string>();
    if (choice.kind == ToolChoice::Kind::kFunction && name != choice.name) continue;
    const auto p = fn.find("parameters");
    out.push_back(ForcedTool{i, name, p != fn.end() && !p->is_null() ? *p : RequestJson{{"type", "object"}}});
  }
  return out;
}

namespace {

// Every local "$ref" ("#..." pointing into the schema itself) of `s`, rebased under `base`.
void rebase_refs(RequestJson& s, const std::string& base) {
  if (s.is_object()) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (it.key() == "$ref" && it->is_string()) {
        const std::string ref = it->get<std::string>();
        if (!ref.empty() && ref[0] == '#') *it = "#" + base + ref.substr(1);
      } else {
        rebase_refs(*it, base);
      }
    }
  } else if (s.is_array()) {
    for (RequestJson& e : s) rebase_refs(e, base);
  }
}

RequestJson call_schema(const ForcedTool& t, const std::string& base) {
  RequestJson args = t.parameters;
  rebase_refs(args, base + "/properties/arguments");
  RequestJson props = RequestJson::object();
  props["name"] = RequestJson{{"const", t.name}};
  props["arguments"] = std::move(args);
  RequestJson s = RequestJson::object();
  s["type"] = "object";
  s["properties"] = std::move(props);
  s["required"] = RequestJson::array({"name", "arguments"});
  s["additionalProperties"] = false;
  return s;
}

}  // namespace

structured::Spec forced_call_spec(const std::vector<ForcedTool>& tools) {
  MD_REQUIRE(!tools.empty(), "a forced tool call needs a tool");
  RequestJson schema;
  if (tools.size() == 1) {
    schema = call_schema(tools[0], "");
  } else {
    schema = RequestJson::object();
    schema["anyOf"] = RequestJson::array();
    for (size_t i = 0; i < tools.size(); ++i) schema["anyOf"].push_back(call_schema(tools[i], cat("/anyOf/", i)));
  }
  structured::Options o;
  o.trailing_whitespace = 1;  // the template's "\n" before "</tool_call>"
  return structured::Spec::json_schema(schema.dump(), o);
}

}  // namespace megadecode
