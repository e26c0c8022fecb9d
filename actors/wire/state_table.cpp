#include "actors/wire/state_table.hpp"

#include <nlohmann/json.hpp>
#include <stdexcept>

namespace troupe::actors {

std::string encode_state_table(const std::vector<tensor_decl>& tensors,
                               const std::string& extras_json) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& t : tensors)
    list.push_back({{"name", t.name},
                    {"array", t.array},
                    {"shape", t.shape},
                    {"dtype", std::string(dtype_name(t.type))},
                    {"role", static_cast<int>(t.role)}});
  return nlohmann::json{{"tensors", std::move(list)}, {"extras", extras_json}}.dump();
}

state_table decode_state_table(const std::string& json_text) {
  state_table out;
  try {
    const auto in = nlohmann::json::parse(json_text);
    out.extras_json = in.at("extras").get<std::string>();
    for (const auto& e : in.at("tensors")) {
      tensor_decl t;
      t.name = e.at("name").get<std::string>();
      t.array = e.at("array").get<std::string>();
      t.shape = e.at("shape").get<std::vector<int64_t>>();
      for (const int64_t d : t.shape)
        if (d < 0) throw std::runtime_error("tensor " + t.name + " has a negative dimension");
      const auto type = parse_dtype(e.at("dtype").get<std::string>());
      if (!type) throw std::runtime_error("tensor " + t.name + " has an unknown dtype");
      t.type = *type;
      const int role = e.at("role").get<int>();
      if (role < 0 || role > static_cast<int>(tensor_role::extra))
        throw std::runtime_error("tensor " + t.name + " has an unknown role");
      t.role = static_cast<tensor_role>(role);
      out.tensors.push_back(std::move(t));
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("a malformed state table: ") + e.what());
  }
  if (out.extras_json.size() > state_view::max_extras_bytes)
    throw std::runtime_error("a state table with " + std::to_string(out.extras_json.size()) +
                             " bytes of extras, more than the 1 MiB a state may hold");
  return out;
}

}  // namespace troupe::actors
