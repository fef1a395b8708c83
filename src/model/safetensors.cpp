// Safetensors reading: one file's header parsed and validated into TensorViews over its bytes, and
// a checkpoint directory (single file or index + shards) assembled from them. Validation follows
// Hugging Face's reader: tensors must tile the data section exactly (no overlap, no gap, no
// trailing bytes), so any file we accept HF accepts too; we are stricter only where HF would
// silently pick one of two answers (duplicate names or fields).
#include "model/safetensors.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "model/mapped_file.h"

namespace megadecode {
namespace {

using nlohmann::json;

constexpr int kMaxJsonDepth = 16;  // a valid header nests 3 deep; bounds the parser's memory on junk

// A JSON value for an error message, shortened: never dumps a whole (possibly huge) object.
std::string brief(const json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array of " + std::to_string(v.size());
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

std::string quoted(const std::string& s) {
  return s.size() > 200 ? "\"" + s.substr(0, 197) + "...\"" : "\"" + s + "\"";
}

// Deepest nesting of {} / [] outside strings; stops counting past the limit.
int json_depth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      max_depth = std::max(max_depth, ++depth);
      if (max_depth > kMaxJsonDepth) break;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return max_depth;
}

// Parses header JSON, refusing duplicate keys in any object (nlohmann would keep the last one).
json parse_header_json(std::string_view text, const std::string& file) {
  MD_REQUIRE(json_depth(text) <= kMaxJsonDepth, file, ": header JSON nests deeper than ", kMaxJsonDepth,
             " levels (not a safetensors header)");
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string top_key, duplicate;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.empty()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (depth == 1) top_key = k;
      if (!keys.back().insert(k).second && duplicate.empty()) {
        duplicate = depth == 1 ? cat("tensor name ", quoted(k)) : cat("field ", quoted(k), " of ", quoted(top_key));
      }
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    throw Error(cat(file, ": header is not valid JSON (", e.what(), ")"));
  }
  MD_REQUIRE(duplicate.empty(), file, ": header repeats ", duplicate);
  return j;
}

std::optional<Dtype> dtype_of(const std::string& s) {
  if (s == "BF16") return Dtype::kBF16;
  if (s == "F16") return Dtype::kF16;
  if (s == "F32") return Dtype::kF32;
  return std::nullopt;
}

bool is_known_unsupported_dtype(const std::string& s) {
  static const std::set<std::string> kOthers = {"BOOL", "U8",  "I8",  "I16",     "U16",     "I32",      "U32",
                                                "I64",  "U64", "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0",  "E8M0",
                                                "F4",   "F6_E2M3", "F6_E3M2", "C64"};
  return kOthers.count(s) != 0;
}

// A non-negative integer that fits in int64 (shape dims, offsets); nullopt otherwise.
std::optional<uint64_t> non_negative(const json& v) {
  if (v.is_number_unsigned()) {
    uint64_t x = v.get<uint64_t>();
    return x <= static_cast<uint64_t>(INT64_MAX) ? std::optional<uint64_t>(x) : std::nullopt;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

struct Entry {
  TensorView view;
  uint64_t begin = 0, end = 0;  // byte range in the data section
};

Entry parse_entry(const std::string& name, const json& v, uint64_t data_bytes, const std::string& file) {
  const std::string where = cat(file, ": tensor ", quoted(name));
  MD_REQUIRE(v.is_object(), where, ": entry is ", brief(v), ", not an object");
  auto dtype_it = v.find("dtype");
  auto shape_it = v.find("shape");
  auto offsets_it = v.find("data_offsets");
  MD_REQUIRE(dtype_it != v.end(), where, ": missing \"dtype\"");
  MD_REQUIRE(shape_it != v.end(), where, ": missing \"shape\"");
  MD_REQUIRE(offsets_it != v.end(), where, ": missing \"data_offsets\"");

  MD_REQUIRE(dtype_it->is_string(), where, ": dtype is ", brief(*dtype_it), ", not a string");
  const std::string& dtype_str = dtype_it->get_ref<const std::string&>();
  std::optional<Dtype> dtype = dtype_of(dtype_str);
  MD_REQUIRE(dtype || !is_known_unsupported_dtype(dtype_str), where, ": dtype ", dtype_str,
             " is not supported (supported: BF16, F16, F32)");
  MD_REQUIRE(dtype, where, ": unknown dtype ", quoted(dtype_str));

  Entry e;
  e.view.name = name;
  e.view.dtype = *dtype;
  e.view.file = file;
  MD_REQUIRE(shape_it->is_array(), where, ": shape is ", brief(*shape_it), ", not an array");
  // The product of the non-zero dims must fit, so TensorView::n_elements() cannot overflow
  // whatever order it multiplies in; the byte size is then bounded by the data section below.
  uint64_t nonzero_product = 1;
  bool has_zero = false;
  for (const json& d : *shape_it) {
    std::optional<uint64_t> dim = non_negative(d);
    MD_REQUIRE(dim, where, ": shape entry ", brief(d), " is not a non-negative integer");
    e.view.shape.push_back(static_cast<int64_t>(*dim));
    if (*dim == 0) {
      has_zero = true;
    } else {
      MD_REQUIRE(!__builtin_mul_overflow(nonzero_product, *dim, &nonzero_product) &&
                     nonzero_product <= static_cast<uint64_t>(INT64_MAX),
                 where, ": shape is too large (element count overflows)");
    }
  }
  uint64_t n_bytes = 0;
  MD_REQUIRE(!__builtin_mul_overflow(has_zero ? 0 : nonzero_product, dtype_bytes(*dtype), &n_bytes), where,
             ": shape is too large (byte size overflows)");

  MD_REQUIRE(offsets_it->is_array() && offsets_it->size() == 2, where, ": data_offsets is ", brief(*offsets_it),
             ", not [begin, end]");
  std::optional<uint64_t> begin = non_negative((*offsets_it)[0]);
  std::optional<uint64_t> end = non_negative((*offsets_it)[1]);
  MD_REQUIRE(begin && end, where, ": data_offsets entries must be non-negative integers, got [",
             brief((*offsets_it)[0]), ", ", brief((*offsets_it)[1]), "]");
  MD_REQUIRE(*begin <= *end, where, ": data_offsets begin ", *begin, " is past end ", *end);
  MD_REQUIRE(*end <= data_bytes, where, ": data_offsets [", *begin, ", ", *end, ") run past the data section (",
             data_bytes, " bytes; file truncated?)");
  MD_REQUIRE(*end - *begin == n_bytes, where, ": data_offsets span ", *end - *begin, " bytes but dtype ", dtype_str,
             " and shape ", shape_it->dump(), " need ", n_bytes);
  e.begin = *begin;
  e.end = *end;
  return e;
}

void check_metadata(const json& v, const std::string& file) {
  MD_REQUIRE(v.is_object(), file, ": __metadata__ is ", brief(v), ", not an object");
  for (const auto& [key, value] : v.items()) {
    MD_REQUIRE(value.is_string(), file, ": __metadata__ entry ", quoted(key), " is ", brief(value),
               ", not a string");
  }
}

// The tensors must tile the data section: sorted by offset, each starts where the previous ended.
void check_tiling(std::vector<const Entry*> entries, uint64_t data_bytes, const std::string& file) {
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : entries) {
    MD_REQUIRE(e->begin >= covered, file, ": tensor ", quoted(e->view.name), " (bytes [", e->begin, ", ", e->end,
               ")) overlaps tensor ", quoted(previous ? previous->view.name : ""), " (bytes [",
               previous ? previous->begin : 0, ", ", covered, "))");
    MD_REQUIRE(e->begin == covered, file, ": gap of ", e->begin - covered, " bytes before tensor ",
               quoted(e->view.name), " (bytes [", covered, ", ", e->begin, ") belong to no tensor)");
    covered = e->end;
    previous = e;
  }
  MD_REQUIRE(covered == data_bytes, file, ": data section is ", data_bytes, " bytes but the tensors cover ", covered,
             " (trailing bytes belong to no tensor)");
}

TensorMap parse_tensors(std::span<const std::byte> bytes, const std::string& file) {
  MD_REQUIRE(bytes.size() >= 8, file, ": file is ", bytes.size(),
             " bytes, too short for the 8-byte header length (truncated?)");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | static_cast<uint8_t>(bytes[i]);
  MD_REQUIRE(header_bytes <= kMaxSafetensorsHeaderBytes, file, ": header length ", header_bytes,
             " is absurd (limit ", kMaxSafetensorsHeaderBytes, "; not a safetensors file?)");
  MD_REQUIRE(header_bytes <= bytes.size() - 8, file, ": header length ", header_bytes, " runs past the end of the ",
             bytes.size(), "-byte file (truncated?)");
  std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, header_bytes);
  MD_REQUIRE(!text.empty() && text.front() == '{', file, ": header does not start with '{'");
  json header = parse_header_json(text, file);
  MD_REQUIRE(header.is_object(), file, ": header is ", brief(header), ", not a JSON object");

  const std::byte* data = bytes.data() + 8 + header_bytes;
  const uint64_t data_bytes = bytes.size() - 8 - header_bytes;
  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      check_metadata(value, file);
      continue;
    }
    entries.push_back(parse_entry(name, value, data_bytes, file));
  }
  std::vector<const Entry*> pointers;
  for (const Entry& e : entries) pointers.push_back(&e);
  check_tiling(std::move(pointers), data_bytes, file);

  TensorMap out;
  for (Entry& e : entries) {
    e.view.data = data + e.begin;
    std::string name = e.view.name;
    out.emplace(std::move(name), std::move(e.view));
  }
  return out;
}

json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  MD_REQUIRE(in.good(), "cannot open ", path.string());
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    throw Error(cat(path.string(), ": not valid JSON (", e.what(), ")"));
  }
}

}  // namespace

SafetensorsFile::~SafetensorsFile() = default;

std::unique_ptr<SafetensorsFile> SafetensorsFile::parse(std::span<const std::byte> bytes, const std::string& name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->tensors_ = parse_tensors(bytes, name);
  return f;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  auto mapped = std::make_unique<MappedFile>(path);
  std::unique_ptr<SafetensorsFile> f = parse(mapped->bytes(), path.string());
  f->file_ = std::move(mapped);
  return f;
}

// Like transformers: a single model.safetensors wins over an index.
Checkpoint Checkpoint::open(const std::filesystem::path& model_dir) {
  namespace fs = std::filesystem;
  MD_REQUIRE(fs::is_directory(model_dir), "model directory ", model_dir.string(), " does not exist");
  Checkpoint c;
  const fs::path single = model_dir / "model.safetensors";
  const fs::path index_path = model_dir / "model.safetensors.index.json";
  if (fs::exists(single)) {
    c.files_.push_back(SafetensorsFile::open(single));
    c.tensors_ = c.files_.back()->tensors();
    return c;
  }
  MD_REQUIRE(fs::exists(index_path), model_dir.string(),
             " holds neither model.safetensors nor model.safetensors.index.json");

  const std::string index_name = index_path.string();
  json index = read_json_file(index_path);
  MD_REQUIRE(index.is_object(), index_name, ": not a JSON object");
  auto wm = index.find("weight_map");
  MD_REQUIRE(wm != index.end(), index_name, ": missing \"weight_map\"");
  MD_REQUIRE(wm->is_object(), index_name, ": weight_map is ", brief(*wm), ", not an object");
  std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> tensors the index puts there
  for (const auto& [tensor, shard] : wm->items()) {
    MD_REQUIRE(shard.is_string(), index_name, ": weight_map entry for tensor ", quoted(tensor), " is ", brief(shard),
               ", not a file name");
    const std::string& s = shard.get_ref<const std::string&>();
    // Shards are plain names in the same directory; never a path that leaves it.
    MD_REQUIRE(!s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos, index_name,
               ": weight_map entry for tensor ", quoted(tensor), " names ", quoted(s), ", not a file in ",
               model_dir.string());
    by_shard[s].push_back(tensor);
  }
  MD_REQUIRE(!by_shard.empty(), index_name, ": weight_map is empty");

  for (const auto& [shard, names] : by_shard) {
    const fs::path path = model_dir / shard;
    MD_REQUIRE(fs::exists(path), index_name, " names shard ", shard, " (for tensor ", quoted(names.front()),
               "), which is missing");
    c.files_.push_back(SafetensorsFile::open(path));
    const TensorMap& held = c.files_.back()->tensors();
    for (const auto& [name, view] : held) {
      auto it = wm->find(name);
      MD_REQUIRE(it != wm->end(), path.string(), " holds tensor ", quoted(name), ", which ", index_name,
                 " does not name");
      MD_REQUIRE(it->get_ref<const std::string&>() == shard, "tensor ", quoted(name), " is in ", path.string(),
                 " but ", index_name, " assigns it to ", it->get<std::string>());
      c.tensors_.emplace(name, view);
    }
    for (const std::string& name : names) {
      MD_REQUIRE(held.count(name) != 0, index_name, " assigns tensor ", quoted(name), " to ", shard,
                 ", which does not hold it");
    }
  }
  return c;
}

}  // namespace megadecode
