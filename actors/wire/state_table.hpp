#pragma once
// A workload's state table and the non-tensor part of its state (extras), as JSON: what a
// program's rank sends ahead of its tensors to a peer that restores from it
// (actors/worker/state_transfer.cpp) and with its checkpoint share to the coordinator, which
// knows a program's state only from its ranks and records it in the manifest.

#include <string>
#include <vector>

#include "runtime/workload/workload.hpp"

namespace troupe::actors {

struct state_table {
  std::vector<tensor_decl> tensors;
  std::string extras_json;
};

std::string encode_state_table(const std::vector<tensor_decl>& tensors,
                               const std::string& extras_json);
/// Throws std::runtime_error naming what is malformed (it comes from another process).
state_table decode_state_table(const std::string& json_text);

}  // namespace troupe::actors
