// The null data plane of control-plane tests: each collective is a reduction over this rank's
// own contribution, nothing that needs a peer's bytes pretends to work, and only
// TROUPE_TRANSPORT=null on every rank picks it.
#include "runtime/comm/null_communicator.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/comm/host_communicator.hpp"

namespace troupe::comm {
namespace {

using namespace std::chrono_literals;

const op_options opts{1s};

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// First in this file: the warning is once per process, and no other test has made one yet.
TEST(null_communicator, warns_once_per_process) {
  testing::internal::CaptureStderr();
  auto a = make_null_communicator({1, "world", 0, 4});
  auto b = make_null_communicator({2, "dp0", 1, 2});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(occurrences(err, "null data plane: collectives do nothing (control-plane tests only)"),
            1u)
      << err;
  EXPECT_NE(err.find("warn"), std::string::npos) << err;
}

TEST(null_communicator, reductions_keep_this_ranks_own_values) {
  auto c = make_null_communicator({3, "world", 2, 4});
  std::vector<float> grad{1.5f, -2.0f, 3.25f};
  const auto before = grad;
  c->all_reduce(grad.data(), grad.size(), reduce_op::sum, opts);
  EXPECT_EQ(grad, before);
  c->all_reduce(grad.data(), grad.size(), reduce_op::average, opts);
  EXPECT_EQ(grad, before);
  c->broadcast(grad.data(), grad.size() * sizeof(float), 0, opts);
  EXPECT_EQ(grad, before);
  c->barrier(opts);

  // reduce_scatter: block 2 (this rank's) of its own input.
  std::vector<float> in(4 * 3);
  std::iota(in.begin(), in.end(), 0.0f);
  std::vector<float> out(3, -1.0f);
  c->reduce_scatter(in.data(), out.data(), 3, reduce_op::sum, opts);
  EXPECT_EQ(out, (std::vector<float>{6, 7, 8}));
}

TEST(null_communicator, gathers_put_the_own_block_in_its_slot_and_leave_the_others) {
  auto c = make_null_communicator({3, "world", 1, 3});
  const std::vector<int> mine{7, 8};
  std::vector<int> all(6, -1);
  c->all_gather(mine.data(), all.data(), 2 * sizeof(int), opts);
  EXPECT_EQ(all, (std::vector<int>{-1, -1, 7, 8, -1, -1}));

  const std::vector<int> send{10, 11, 12};
  std::vector<int> recv(3, -1);
  c->all_to_all(send.data(), recv.data(), sizeof(int), opts);
  EXPECT_EQ(recv, (std::vector<int>{-1, 11, -1}));

  // Uneven: rank 1 sends itself 2 ints, after the 1 it sends rank 0.
  const std::vector<int> packed{20, 21, 22, 23};
  const std::vector<size_t> send_bytes{sizeof(int), 2 * sizeof(int), sizeof(int)};
  const std::vector<size_t> recv_bytes{3 * sizeof(int), 2 * sizeof(int), 0};
  std::vector<int> unpacked(5, -1);
  c->all_to_allv(packed.data(), send_bytes, unpacked.data(), recv_bytes, opts);
  EXPECT_EQ(unpacked, (std::vector<int>{-1, -1, -1, 21, 22}));
  // What the rank sends itself must match what it expects from itself.
  EXPECT_THROW(c->all_to_allv(packed.data(), send_bytes, unpacked.data(),
                              {sizeof(int), sizeof(int), sizeof(int)}, opts),
               comm_error);
}

TEST(null_communicator, a_peers_bytes_are_refused_not_made_up) {
  auto c = make_null_communicator({5, "pair", 1, 2});
  std::vector<char> buf(16, 'x');
  try {
    c->recv(buf.data(), buf.size(), 0, 3, opts);
    FAIL() << "recv of bytes from a peer returned";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::invalid);
    EXPECT_NE(std::string(e.what()).find("TROUPE_TRANSPORT=null"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("generation 5"), std::string::npos) << e.what();
  }
  EXPECT_EQ(buf, std::vector<char>(16, 'x'));
  EXPECT_THROW(c->send(buf.data(), buf.size(), 0, 3, opts), comm_error);
  EXPECT_THROW(c->send_recv(buf.data(), 4, 0, buf.data(), 4, 0, 3, opts), comm_error);
  // Zero bytes need no peer, as on every backend.
  c->send(nullptr, 0, 0, 3, opts);
  c->recv(nullptr, 0, 0, 3, opts);
  EXPECT_THROW(c->send(nullptr, 0, 2, 3, opts), comm_error);  // not a rank of the group
}

TEST(null_communicator, abort_ends_it_and_shrink_gives_the_new_group) {
  auto c = make_null_communicator({6, "world", 2, 4});
  c->abort();
  EXPECT_TRUE(c->aborted());
  float x = 1;
  try {
    c->all_reduce(&x, 1, reduce_op::sum, opts);
    FAIL() << "an aborted communicator ran a collective";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::aborted);
  }
  auto shrunk = c->shrink({7, "world", 1, 3}, {0, 2, 3});
  ASSERT_NE(shrunk, nullptr);
  EXPECT_EQ(shrunk->rank(), 1);
  EXPECT_EQ(shrunk->size(), 3);
  EXPECT_EQ(shrunk->generation(), 7u);
  EXPECT_FALSE(shrunk->aborted());
  shrunk->all_reduce(&x, 1, reduce_op::sum, opts);
  EXPECT_THROW(c->shrink({7, "world", 0, 3}, {0, 2, 3}), comm_error);  // 0 is not this rank
  EXPECT_THROW(c->shrink({7, "world", 1, 2}, {0, 2, 3}), comm_error);  // sizes differ
  EXPECT_THROW(make_null_communicator({1, "world", 4, 4}), comm_error);
}

// A store that no one may touch: the null data plane meets no one.
class untouchable_store final : public kv_store {
 public:
  void set(const std::string& key, const std::vector<char>&) override { touched(key); }
  std::vector<char> get(const std::string& key, std::chrono::milliseconds) override {
    touched(key);
    return {};
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds) override {
    touched(keys.empty() ? "" : keys.front());
  }
  int64_t add(const std::string& key, int64_t) override {
    touched(key);
    return 0;
  }
  bool check(const std::vector<std::string>& keys) override {
    touched(keys.empty() ? "" : keys.front());
    return false;
  }

 private:
  static void touched(const std::string& key) { ADD_FAILURE() << "the store was used: " << key; }
};

TEST(null_transport, only_troupe_transport_null_on_every_rank_picks_it) {
  const std::vector<std::string> hosts{"a", "a", "b"};
  EXPECT_EQ(choose_transport({"null", "null", "null"}, hosts), transport_kind::null);
  EXPECT_THROW(choose_transport({"null", "auto", "null"}, hosts), comm_error);
  EXPECT_THROW(choose_transport({"tcp", "null", "null"}, hosts), comm_error);
  EXPECT_NE(choose_transport({"auto", "auto", "auto"}, hosts), transport_kind::null);

  untouchable_store store;
  ::setenv("TROUPE_TRANSPORT", "null", 1);
  EXPECT_EQ(requested_transport(), "null");
  EXPECT_EQ(transport_identity().rfind("null\n", 0), 0u);
  const auto started = std::chrono::steady_clock::now();
  auto c = make_host_communicator(store, {9, "world", 3, 8});
  EXPECT_LT(std::chrono::steady_clock::now() - started, 1s);  // no peer was waited for
  EXPECT_EQ(c->rank(), 3);
  EXPECT_EQ(c->size(), 8);
  std::vector<char> buf(4);
  try {
    c->recv(buf.data(), buf.size(), 0, 1, opts);
    FAIL() << "recv returned";
  } catch (const comm_error& e) {  // the backend shows in its errors
    EXPECT_EQ(std::string(e.what()).rfind("null ", 0), 0u) << e.what();
  }
  ::setenv("TROUPE_TRANSPORT", "nul", 1);
  EXPECT_THROW(requested_transport(), comm_error);
  ::unsetenv("TROUPE_TRANSPORT");
  EXPECT_EQ(requested_transport(), "auto");
}

}  // namespace
}  // namespace troupe::comm
