// A program's state table as it travels (actors/wire/state_table.hpp): what one process encodes
// another decodes unchanged, and what a peer or a damaged report sends is refused by name.

#include "actors/wire/state_table.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace troupe::actors {
namespace {

std::vector<tensor_decl> sample_table() {
  return {{"model/fc.weight", "model", {4, 3}, dtype::f32, tensor_role::parameter},
          {"model/bn.num_batches_tracked", "model", {}, dtype::i64, tensor_role::buffer},
          {"optim/state/0/step", "optim", {}, dtype::f32, tensor_role::optimizer},
          {"extras/mask", "extra", {7}, dtype::boolean, tensor_role::extra}};
}

TEST(state_table, RoundTripsEveryField) {
  const std::string extras = R"({"model":{},"optim":{"param_groups":[]}})";
  const state_table back = decode_state_table(encode_state_table(sample_table(), extras));
  EXPECT_EQ(back.tensors, sample_table());
  EXPECT_EQ(back.extras_json, extras);
}

void expect_refused(const std::string& text, const std::string& words) {
  try {
    (void)decode_state_table(text);
    ADD_FAILURE() << "accepted: " << text;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(state_table, RefusesWhatNoTroupeProcessSends) {
  expect_refused("not json", "malformed");
  expect_refused(R"({"tensors":[]})", "malformed");  // no extras
  expect_refused(
      R"({"extras":"","tensors":[{"name":"a","array":"model","shape":[-1],"dtype":"f32","role":0}]})",
      "negative dimension");
  expect_refused(
      R"({"extras":"","tensors":[{"name":"a","array":"model","shape":[2],"dtype":"f128","role":0}]})",
      "unknown dtype");
  expect_refused(
      R"({"extras":"","tensors":[{"name":"a","array":"model","shape":[2],"dtype":"f32","role":9}]})",
      "unknown role");
  const std::string huge(state_view::max_extras_bytes + 1, ' ');
  expect_refused(encode_state_table(sample_table(), huge), "more than the 1 MiB");
}

}  // namespace
}  // namespace troupe::actors
