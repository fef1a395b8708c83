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

// {"name": <const>, "arguments": <parameters>}: a Hermes call object at `base`.
RequestJson hermes_call(const ForcedTool& t, const std::string& base) {
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

// {"tool_call_id": <string>, "tool_name": <const>, "parameters": <parameters>}: a cmd4 action at `base`.
RequestJson cmd4_action(const ForcedTool& t, const std::string& base) {
  RequestJson params = t.parameters;
  rebase_refs(params, base + "/properties/parameters");
  RequestJson props = RequestJson::object();
  props["tool_call_id"] = RequestJson{{"type", "string"}, {"minLength", 1}, {"maxLength", 8}};
  props["tool_name"] = RequestJson{{"const", t.name}};
  props["parameters"] = std::move(params);
  RequestJson s = RequestJson::object();
  s["type"] = "object";
  s["properties"] = std::move(props);
  s["required"] = RequestJson::array({"tool_call_id", "tool_name", "parameters"});
  s["additionalProperties"] = false;
  return s;
}

// One of `tools` at `base`: the call itself, or anyOf over them.
template <typename Make>
RequestJson one_of(const std::vector<ForcedTool>& tools, const std::string& base, Make&& make) {
  if (tools.size() == 1) return make(tools[0], base);
  RequestJson s = RequestJson::object();
  s["anyOf"] = RequestJson::array();
  for (size_t i = 0; i < tools.size(); ++i) s["anyOf"].push_back(make(tools[i], cat(base, "/anyOf/", i)));
  return s;
}

}  // namespace

const char* held_call_opening(ToolCallFormat format) {
  return format == ToolCallFormat::kCohereCommand4 ? "<|START_ACTION|>" : "<tool_call>\n";
}

const char* held_call_close(ToolCallFormat format) {
  return format == ToolCallFormat::kCohereCommand4 ? "<|END_ACTION|>" : "</tool_call>";
}

structured::Spec forced_call_spec(ToolCallFormat format, const std::vector<ForcedTool>& tools, bool parallel) {
  MD_REQUIRE(!tools.empty(), "a forced tool call needs a tool");
  switch (format) {
    case ToolCallFormat::kHermes: {
      structured::Options o;
      o.trailing_whitespace = 1;  // the template's "\n" before "</tool_call>"
      return structured::Spec::json_schema(one_of(tools, "", hermes_call).dump(), o);
    }
    case ToolCallFormat::kQwen3Coder: {
      RequestJson list = RequestJson::array();
      for (size_t i = 0; i < tools.size(); ++i) {
        RequestJson params = tools[i].parameters;
        rebase_refs(params, cat("/", i, "/parameters"));
        list.push_back(RequestJson{{"name", tools[i].name}, {"parameters", std::move(params)}});
      }
      return structured::Spec::xml_call(list.dump());
    }
    case ToolCallFormat::kCohereCommand4: {
      RequestJson s = RequestJson::object();
      s["type"] = "array";
      s["items"] = one_of(tools, "/items", cmd4_action);
      s["minItems"] = 1;
      if (!parallel) s["maxItems"] = 1;
      structured::Options o;
      o.max_whitespace = 5;  // the template's "[\n    {"
      return structured::Spec::json_schema(s.dump(), o);
    }
  }
  MD_CHECK(false, "forced_call_spec: unknown format");
  return {};
}

}  // namespace megadecode
