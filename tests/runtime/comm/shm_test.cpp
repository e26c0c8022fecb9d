// The shared-memory backend within one process (ranks as threads, which shm allows: the
// segment is opened through /proc/<pid>/fd either way), and the pure transport choice of
// make_host_communicator. The multi-process suites (comm_shm_*multiproc_test) cover the rest.
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <thread>

#include "runtime/comm/host_communicator.hpp"
#include "runtime/comm/shm_communicator.hpp"
#include "runtime/comm/shm_staging.hpp"
#include "runtime/comm/store.hpp"
#include "tests/runtime/comm/collective_scenarios.hpp"
#include "tests/runtime/comm/patterns.hpp"

using namespace troupe;
using namespace troupe::comm;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

/// Connects `size` ranks of `group` as threads, each with its own store client (a client's
/// blocking get holds its connection); returns them in rank order.
std::vector<std::unique_ptr<communicator>> connect_threads(const tcp_store_server& server,
                                                           const std::string& group, int size,
                                                           const shm_options& o = {},
                                                           uint64_t generation = 7) {
  std::vector<std::future<std::unique_ptr<communicator>>> f;
  for (int r = 0; r < size; ++r) {
    f.push_back(std::async(std::launch::async, [&, r] {
      auto store = connect_tcp_store("127.0.0.1", server.port(), 5s);
      return make_shm_communicator(*store, {generation, group, r, size}, o);
    }));
  }
  std::vector<std::unique_ptr<communicator>> out;
  for (auto& x : f) out.push_back(x.get());
  return out;
}

/// This process's descriptors of shm segments and pidfds.
size_t shm_fds() {
  size_t n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (const dirent* e = readdir(d)) {
      char target[256] = {};
      const std::string path = std::string("/proc/self/fd/") + e->d_name;
      if (readlink(path.c_str(), target, sizeof(target) - 1) > 0) {
        const std::string t(target);
        n += t.find("memfd:troupe-g") != std::string::npos || t.find("pidfd") != std::string::npos;
      }
    }
    closedir(d);
  }
  // The staging pool keeps its pieces and a pidfd per peer it mapped, across communicators.
  return n - shm_detail::staging_pool::process().current().pidfds;
}

/// Every op on 3 ranks as threads, once staged through small chunks (many rounds even for
/// small buffers) and once single-copy for everything from 4 KiB.
class shm_paths : public ::testing::TestWithParam<bool> {};

TEST_P(shm_paths, threads_run_every_op_against_the_local_reference) {
  tcp_store_server server;
  shm_options o;
  if (GetParam()) {
    o.single_copy_bytes = 4096;
    o.single_copy_gathers = true;
  } else {
    o.chunk_bytes = 4096;
    o.single_copy_bytes = SIZE_MAX;
  }
  o.p2p_chunk_bytes = 4096;
  {
    auto cs = connect_threads(server, GetParam() ? "single" : "staged", 3, o);
    // No segment descriptor left open; the peers' pidfds are the staging pool's.
    EXPECT_EQ(shm_fds(), 0u);
    std::vector<std::future<std::string>> runs;
    for (int r = 0; r < 3; ++r) {
      runs.push_back(std::async(std::launch::async, [&, r]() -> std::string {
        auto& c = *cs[r];
        for (const size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{100003}}) {
          auto v = test::contributions(r, count);
          c.all_reduce(v.data(), count, reduce_op::average, {10s});
          if (auto e = test::check_reduced(v, 3, reduce_op::average); !e.empty()) return e;
          if (auto e = test::check_collective_set(c, count); !e.empty()) return e;
          // Point to point, staged or (single-copy, from 4 KiB) read from the sender's buffer.
          std::vector<char> big(count * 4 + 1);
          for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 + r);
          if (r == 0) c.send(big.data(), big.size(), 1, 9, {10s});
          if (r == 1) {
            std::vector<char> got(big.size(), 5);
            c.recv(got.data(), got.size(), 0, 9, {10s});
            for (size_t i = 0; i < got.size(); ++i)
              if (got[i] != static_cast<char>(i * 7)) return "recv got the wrong bytes";
          }
          c.barrier({10s});
        }
        return {};
      }));
    }
    for (auto& f : runs) EXPECT_EQ(f.get(), "");
  }
  EXPECT_EQ(shm_fds(), 0u);  // pidfds and the segment's descriptor are all closed
}

INSTANTIATE_TEST_SUITE_P(shm_communicator, shm_paths, ::testing::Bool(),
                         [](const auto& p) { return p.param ? "single_copy" : "staged"; });

TEST(shm_communicator, group_of_one_copies_and_rejects_peers) {
  tcp_store_server server;
  auto store = connect_tcp_store("127.0.0.1", server.port(), 5s);
  auto c = make_shm_communicator(*store, {1, "solo", 0, 1});
  std::vector<float> in{1, 2, 3};
  std::vector<float> out(3);
  c->reduce_scatter(in.data(), out.data(), 3, reduce_op::average, {1s});
  EXPECT_EQ(out, in);
  c->all_reduce(in.data(), 3, reduce_op::average, {1s});
  EXPECT_EQ(in, (std::vector<float>{1, 2, 3}));
  c->barrier({1s});
  EXPECT_THROW(c->send(in.data(), 4, 0, 1, {1s}), comm_error);
  EXPECT_THROW(make_shm_communicator(*store, {1, "bad/name", 0, 1}), comm_error);
}

TEST(shm_communicator, abort_wakes_a_sleeping_wait_and_tells_the_peer) {
  tcp_store_server server;
  auto cs = connect_threads(server, "abort", 2);
  // Rank 0 waits for a rank 1 that never comes; abort() from here must end it promptly.
  auto waiting = std::async(std::launch::async, [&] {
    std::vector<float> v(100, 1.0f);
    const auto start = clock_type::now();
    try {
      cs[0]->all_reduce(v.data(), v.size(), reduce_op::sum, {30s});
    } catch (const comm_error& e) {
      return std::make_pair(e.code(), clock_type::now() - start);
    }
    return std::make_pair(comm_errc::internal, clock_type::now() - start);
  });
  std::this_thread::sleep_for(200ms);  // likely asleep on the futex by then; holds either way
  cs[0]->abort();
  const auto [code, took] = waiting.get();
  EXPECT_EQ(code, comm_errc::aborted);
  EXPECT_LT(took, 200ms + 2s);
  // Rank 1 may still complete the all-reduce rank 0 had staged its data for; the op after it
  // must fail at once: rank 0 left.
  std::vector<float> v(100, 1.0f);
  try {
    cs[1]->all_reduce(v.data(), v.size(), reduce_op::sum, {30s});
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::peer_lost) << e.what();
  }
  const auto start = clock_type::now();
  try {
    cs[1]->barrier({30s});
    FAIL() << "barrier finished without rank 0";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::peer_lost) << e.what();
    EXPECT_NE(std::string(e.what()).find("shm "), std::string::npos) << e.what();
  }
  EXPECT_LT(clock_type::now() - start, 1s);
}

TEST(shm_communicator, ranks_in_different_collectives_fail_instead_of_mixing_data) {
  tcp_store_server server;
  auto store = connect_tcp_store("127.0.0.1", server.port(), 5s);
  auto cs = connect_threads(server, "mixed", 2);
  auto other = std::async(std::launch::async, [&] {
    std::vector<char> b(64);
    try {
      cs[1]->broadcast(b.data(), b.size(), 0, {10s});
    } catch (const comm_error& e) {
      return e.code();
    }
    return comm_errc::internal;
  });
  std::vector<float> v(16, 1.0f);
  try {
    cs[0]->all_reduce(v.data(), v.size(), reduce_op::sum, {10s});
    FAIL() << "all_reduce paired with a broadcast";
  } catch (const comm_error& e) {
    EXPECT_TRUE(e.code() == comm_errc::invalid || e.code() == comm_errc::peer_lost) << e.what();
  }
  const auto code = other.get();
  EXPECT_TRUE(code == comm_errc::invalid || code == comm_errc::peer_lost);
}

/// One checked all-reduce on every communicator of `cs`, each from its own thread.
std::string all_reduce_on_threads(std::vector<std::unique_ptr<communicator>>& cs) {
  std::vector<std::future<std::string>> runs;
  for (size_t r = 0; r < cs.size(); ++r) {
    runs.push_back(std::async(std::launch::async, [&, r] {
      auto v = test::contributions(static_cast<int>(r), 3000);
      cs[r]->all_reduce(v.data(), v.size(), reduce_op::average, {10s});
      return test::check_reduced(v, static_cast<int>(cs.size()), reduce_op::average);
    }));
  }
  std::string errors;
  for (auto& f : runs) errors += f.get();
  return errors;
}

// A group rebuilt after a failure stages through the memory of the dead group it replaces,
// which every survivor has mapped and faulted in already; a live group's is never taken.
TEST(shm_communicator, a_rebuilt_group_reuses_the_dead_groups_staging) {
  tcp_store_server server;
  auto& pool = shm_detail::staging_pool::process();
  auto old_group = connect_threads(server, "reuse.dp0", 3, {}, 1);
  auto live_group = connect_threads(server, "reuse.dp1", 3, {}, 1);
  ASSERT_EQ(all_reduce_on_threads(old_group), "");
  const auto before = pool.current();
  for (auto& c : old_group) c->abort();
  auto rebuilt = connect_threads(server, "reuse.dp0", 3, {}, 2);
  EXPECT_EQ(pool.current().own, before.own);  // the dead group's three pieces, nothing new
  EXPECT_EQ(pool.current().peers, before.peers);
  EXPECT_EQ(all_reduce_on_threads(rebuilt), "");
  EXPECT_EQ(all_reduce_on_threads(live_group), "");  // its staging was left alone
  // The dead group gave its staging away: it can never write there again.
  std::vector<float> v(10, 1.0f);
  EXPECT_THROW(old_group[0]->all_reduce(v.data(), v.size(), reduce_op::sum, {1s}), comm_error);
  // Another group of the kind while both are alive gets staging of its own.
  auto third = connect_threads(server, "reuse.dp2", 3, {}, 2);
  EXPECT_EQ(pool.current().own, before.own + 3);
  EXPECT_EQ(all_reduce_on_threads(third), "");
}

/// Every collective of the reference set on each of `cs` (from its own thread), with the
/// ranks and size each communicator says it has.
std::string collectives_on_threads(std::vector<std::unique_ptr<communicator>>& cs, size_t count) {
  std::vector<std::future<std::string>> runs;
  for (auto& c : cs)
    runs.push_back(std::async(std::launch::async, [&c, count] {
      auto v = test::contributions(c->identity().rank, count);
      c->all_reduce(v.data(), v.size(), reduce_op::sum, {10s});
      std::string e = test::check_reduced(v, c->identity().size, reduce_op::sum);
      return e.empty() ? test::check_collective_set(*c, count) : e;
    }));
  std::string errors;
  for (auto& f : runs) errors += f.get();
  return errors;
}

/// An all-reduce on `c`, whose only peer has left, fails with peer_lost long before its
/// 30 s deadline.
void expect_peer_lost_at_once(communicator& c) {
  std::vector<float> v(8, 1.0f);
  const auto start = clock_type::now();
  try {
    c.all_reduce(v.data(), v.size(), reduce_op::sum, {30s});
    ADD_FAILURE() << "an all-reduce finished without its peer";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::peer_lost) << e.what();
  }
  EXPECT_LT(clock_type::now() - start, 5s);
}

// After a rank is lost, the others go on in the segment they have: the same results as a
// newly connected group of their number, without a store round, a new mapping or new staging,
// and nothing the aborted group left behind (rounds it published, gone marks) reaches them.
TEST(shm_communicator, the_ranks_left_shrink_into_a_group_of_their_own) {
  tcp_store_server server;
  auto& pool = shm_detail::staging_pool::process();
  auto old_group = connect_threads(server, "shrink.dp0", 4, {}, 3);
  ASSERT_EQ(all_reduce_on_threads(old_group), "");
  const auto before = pool.current();
  // Rank 1 is lost; the others are caught in an all-reduce, which they published their part
  // of, and fail; then the coordinator's abort reaches them.
  old_group[1].reset();
  std::vector<std::future<comm_errc>> caught;
  for (int r : {0, 2, 3})
    caught.push_back(std::async(std::launch::async, [&, r] {
      std::vector<float> v(64, 1.0f);
      try {
        old_group[r]->all_reduce(v.data(), v.size(), reduce_op::sum, {10s});
      } catch (const comm_error& e) {
        return e.code();
      }
      return comm_errc::internal;
    }));
  for (auto& f : caught) EXPECT_EQ(f.get(), comm_errc::peer_lost);
  for (int r : {0, 2, 3}) old_group[r]->abort();

  const std::vector<int> kept{0, 2, 3};
  std::vector<std::unique_ptr<communicator>> group;
  for (int r = 0; r < 3; ++r) {
    group.push_back(old_group[kept[r]]->shrink({4, "shrink.dp0", r, 3}, kept));
    ASSERT_NE(group.back(), nullptr);
    EXPECT_EQ(group.back()->identity().rank, r);
    EXPECT_EQ(group.back()->identity().size, 3);
  }
  EXPECT_EQ(pool.current().own, before.own);  // nothing new was allocated or mapped
  EXPECT_EQ(pool.current().peers, before.peers);
  for (const size_t count : {size_t{1}, size_t{1000}, size_t{300000}})
    EXPECT_EQ(collectives_on_threads(group, count), "") << count << " floats";
  // The aborted group's communicators go away (marking their ranks gone for generation 3);
  // the group of generation 4 on the same ranks and segment goes on.
  for (auto& c : old_group) c.reset();
  EXPECT_EQ(collectives_on_threads(group, 1000), "");
  // A channel may still hold an aborted message: point to point needs a connected group.
  std::vector<char> bytes(16);
  EXPECT_THROW(group[0]->send(bytes.data(), bytes.size(), 1, 1, {1s}), comm_error);

  // And once more, from the shrunk group: ranks 0 and 2 of it (first 0 and 3) go on.
  for (auto& c : group) c->abort();
  const std::vector<int> again{0, 2};
  std::vector<std::unique_ptr<communicator>> pair;
  for (int r = 0; r < 2; ++r)
    pair.push_back(group[again[r]]->shrink({6, "shrink.dp0", r, 2}, again));
  group.clear();
  EXPECT_EQ(collectives_on_threads(pair, 1000), "");
  // Its loss is seen at once by the rank left: it fails instead of waiting for its deadline.
  pair[1].reset();
  expect_peer_lost_at_once(*pair[0]);
}

// A rank's newer group is aborted first; destroying its older group afterwards must not take
// back the mark that tells the newer group's peers it left.
TEST(shm_communicator, an_older_group_never_takes_back_a_newer_groups_gone_mark) {
  tcp_store_server server;
  auto old_group = connect_threads(server, "shrink.mark", 2, {}, 1);
  for (auto& c : old_group) c->abort();
  std::vector<std::unique_ptr<communicator>> group;
  for (int r = 0; r < 2; ++r)
    group.push_back(old_group[r]->shrink({2, "shrink.mark", r, 2}, {0, 1}));
  group[1]->abort();
  old_group[1].reset();
  expect_peer_lost_at_once(*group[0]);
}

TEST(shm_communicator, a_shrink_that_does_not_fit_the_group_is_refused) {
  tcp_store_server server;
  auto cs = connect_threads(server, "shrink.bad", 3, {}, 5);
  for (auto& c : cs) c->abort();
  auto& c = *cs[1];
  const auto refused = [&](const comm_identity& id, const std::vector<int>& kept) {
    try {
      c.shrink(id, kept);
    } catch (const comm_error& e) {
      return e.code() == comm_errc::invalid;
    }
    return false;
  };
  EXPECT_TRUE(refused({5, "shrink.bad", 0, 2}, {1, 2}));  // not newer than generation 5
  EXPECT_TRUE(refused({6, "shrink.bad", 0, 2}, {0, 1}));  // new rank 0 is not this rank
  EXPECT_TRUE(refused({6, "shrink.bad", 1, 2}, {1, 1}));  // twice the same rank
  EXPECT_TRUE(refused({6, "shrink.bad", 1, 2}, {0, 3}));  // no rank 3 in a group of three
  EXPECT_TRUE(refused({6, "shrink.bad", 1, 3}, {0, 1}));  // the size does not match the list
  EXPECT_FALSE(refused({6, "shrink.bad", 0, 2}, {1, 2}));
}

// One rank that cannot (here: will not) read its peers' memory makes the whole group stage:
// the others learn it from its published verdict at their first large operation.
TEST(shm_communicator, one_rank_without_single_copy_makes_every_rank_stage) {
  tcp_store_server server;
  std::vector<std::future<std::string>> runs;
  for (int r = 0; r < 3; ++r) {
    runs.push_back(std::async(std::launch::async, [&, r]() -> std::string {
      shm_options o;
      o.single_copy_bytes = r == 2 ? SIZE_MAX : 4096;
      auto store = connect_tcp_store("127.0.0.1", server.port(), 5s);
      auto c = make_shm_communicator(*store, {3, "verdict", r, 3}, o);
      for (const size_t count : {size_t{100003}, size_t{7}, size_t{300000}}) {
        auto v = test::contributions(r, count);
        c->all_reduce(v.data(), count, reduce_op::sum, {10s});
        if (auto e = test::check_reduced(v, 3, reduce_op::sum); !e.empty()) return e;
      }
      return {};
    }));
  }
  for (auto& f : runs) EXPECT_EQ(f.get(), "");
}

TEST(host_transport, shm_when_every_rank_is_on_this_host_unless_tcp_is_asked_for) {
  const std::vector<std::string> same{"a 1", "a 1", "a 1"};
  const std::vector<std::string> mixed{"a 1", "b 2", "a 1"};
  EXPECT_EQ(choose_transport({"auto", "auto", "auto"}, same), transport_kind::shm);
  // Across hosts, with two ranks on one: shm inside the host, TCP between (hierarchical).
  EXPECT_EQ(choose_transport({"auto", "auto", "auto"}, mixed), transport_kind::hierarchical);
  EXPECT_EQ(choose_transport({"auto", "auto", "auto"}, {"a 1", "b 2", "c 3"}), transport_kind::tcp);
  EXPECT_EQ(choose_transport({"auto", "tcp", "auto"}, same), transport_kind::tcp);
  EXPECT_EQ(choose_transport({"shm", "auto", "shm"}, same), transport_kind::shm);
  EXPECT_EQ(choose_transport({"shm", "tcp", "auto"}, mixed), transport_kind::tcp);
  EXPECT_THROW(choose_transport({"shm", "auto", "auto"}, mixed), comm_error);
  const std::string me = this_host_identity();
  EXPECT_NE(me.find(' '), std::string::npos);
  EXPECT_GT(me.size(), 20u);  // hostname, space, a 36-character boot id
}

TEST(host_transport, make_host_communicator_follows_troupe_transport) {
  tcp_store_server server;
  auto store = connect_tcp_store("127.0.0.1", server.port(), 5s);
  for (const char* t : {"shm", "tcp", "auto"}) {
    ::setenv("TROUPE_TRANSPORT", t, 1);
    const uint64_t gen = std::string(t) == "shm" ? 1 : std::string(t) == "tcp" ? 2 : 3;
    std::vector<std::future<std::unique_ptr<communicator>>> f;
    for (int r = 0; r < 2; ++r) {
      f.push_back(std::async(std::launch::async, [&, r] {
        auto own = connect_tcp_store("127.0.0.1", server.port(), 5s);
        return make_host_communicator(*own, {gen, "h", r, 2});
      }));
    }
    auto c0 = f[0].get();
    auto c1 = f[1].get();
    // Which backend it is shows in its error messages.
    const std::string want = std::string(t) == "tcp" ? "gloo " : "shm ";
    try {
      c0->send(nullptr, 4, 1, 0, {1s});
    } catch (const comm_error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(want, 0), 0u) << t << ": " << e.what();
    }
  }
  ::setenv("TROUPE_TRANSPORT", "bogus", 1);
  EXPECT_THROW(make_host_communicator(*store, {4, "h", 0, 1}), comm_error);
  ::unsetenv("TROUPE_TRANSPORT");
}

TEST(host_transport, a_group_known_to_be_on_one_host_goes_straight_to_shared_memory) {
  tcp_store_server server;
  auto store = connect_tcp_store("127.0.0.1", server.port(), 5s);
  ::unsetenv("TROUPE_TRANSPORT");
  EXPECT_EQ(transport_identity(), "auto\n" + this_host_identity());
  gloo_options o;
  o.known_one_host = true;
  std::vector<std::future<std::unique_ptr<communicator>>> f;
  for (int r = 0; r < 3; ++r) {
    f.push_back(std::async(std::launch::async, [&, r] {
      auto own = connect_tcp_store("127.0.0.1", server.port(), 5s);
      return make_host_communicator(*own, {5, "k", r, 3}, o);
    }));
  }
  std::vector<std::unique_ptr<communicator>> cs;
  for (auto& x : f) cs.push_back(x.get());
  // Nobody published a host: rank 0 did not wait for the others' before its segment.
  EXPECT_FALSE(store->check({"g5/k/host/1"}));
  EXPECT_FALSE(store->check({"g5/k/host/2"}));
  EXPECT_TRUE(store->check({"g5/k/host/verdict"}));
  std::vector<std::future<std::vector<float>>> sums;
  for (int r = 0; r < 3; ++r) {
    sums.push_back(std::async(std::launch::async, [&, r] {
      std::vector<float> v{static_cast<float>(r + 1)};
      cs[r]->all_reduce(v.data(), 1, reduce_op::sum, {10s});
      return v;
    }));
  }
  for (auto& x : sums) EXPECT_EQ(x.get(), (std::vector<float>{6}));
  try {
    cs[0]->send(nullptr, 4, 1, 0, {1s});  // which backend it is shows in its errors
  } catch (const comm_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("shm ", 0), 0u) << e.what();
  }
  // A rank that asked for tcp cannot have been told that nobody did.
  ::setenv("TROUPE_TRANSPORT", "tcp", 1);
  try {
    (void)make_host_communicator(*store, {6, "k", 0, 2}, o);
    ADD_FAILURE() << "a tcp rank connected over shared memory";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::invalid) << e.what();
  }
  ::unsetenv("TROUPE_TRANSPORT");
}

TEST(shm_communicator, a_segment_word_that_is_not_one_is_refused) {
  tcp_store_server server;
  auto store = connect_tcp_store("127.0.0.1", server.port(), 5s);
  store->set_string("g12/w/shm/segment", "tcp");
  try {
    (void)make_shm_communicator(*store, {12, "w", 1, 2});
    ADD_FAILURE() << "connected to no segment";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::invalid) << e.what();
    EXPECT_NE(std::string(e.what()).find("published no segment but 'tcp'"), std::string::npos)
        << e.what();
  }
}

TEST(host_transport, a_cancelled_connect_gives_up_in_the_store_and_in_the_segment) {
  tcp_store_server server;
  auto store = connect_tcp_store("127.0.0.1", server.port(), 5s);
  const size_t fds_before = shm_fds();
  std::atomic<bool> cancel{false};
  const auto expect_aborted = [&](const char* what, auto&& connect) {
    cancel = false;
    std::thread canceller([&] {
      std::this_thread::sleep_for(100ms);
      cancel = true;
    });
    const auto start = clock_type::now();
    try {
      (void)connect();
      ADD_FAILURE() << what << ": connected although its peer never came";
    } catch (const comm_error& e) {
      EXPECT_EQ(e.code(), comm_errc::aborted) << what << ": " << e.what();
    }
    EXPECT_LT(clock_type::now() - start, 5s) << what << " (the connect timeout is 30 s)";
    canceller.join();
  };
  gloo_options o;
  o.connect_timeout = 30s;
  o.cancelled = [&] { return cancel.load(); };
  // Rank 1 of 2 waits in the store for rank 0's verdict; rank 0 waits for rank 1's host.
  expect_aborted("rank 1", [&] { return make_host_communicator(*store, {9, "h", 1, 2}, o); });
  expect_aborted("rank 0", [&] { return make_host_communicator(*store, {10, "h", 0, 2}, o); });
  // Rank 0 of a shm group publishes its segment and waits in it for the others to map it.
  shm_options so;
  so.connect_timeout = 30s;
  so.cancelled = o.cancelled;
  expect_aborted("the segment", [&] { return make_shm_communicator(*store, {11, "s", 0, 2}, so); });
  EXPECT_EQ(shm_fds(), fds_before) << "a cancelled connect leaves no segment open";
}

}  // namespace
