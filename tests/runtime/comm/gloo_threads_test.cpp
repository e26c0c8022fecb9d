// The gloo communicator with every rank a thread of this process: a quick check of the
// algorithms (sizes, roots, options) without process management. The multi-process tests are
// the ones that prove the data plane crosses process boundaries.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "tests/runtime/comm/patterns.hpp"

using namespace troupe;
using namespace troupe::comm;
using namespace std::chrono_literals;

namespace {

/// Runs body(rank, communicator) on `size` threads, one communicator each.
template <class Body>
void on_ranks(int size, const gloo_options& opts, Body body) {
  tcp_store_server server;
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto store = connect_tcp_store("127.0.0.1", server.port(), 5s);
      auto c = make_gloo_communicator(*store, {7, "threads", r, size}, opts);
      body(r, *c);
    }));
  }
  for (auto& f : ranks) f.get();  // rethrows a rank's failure
}

TEST(gloo_threads, all_reduce_every_size_with_tiny_segments) {
  // Tiny segments and a shallow pipeline exercise many segments per block, empty segments
  // and the ring on small counts.
  gloo_options opts;
  opts.segment_bytes = 64;
  opts.pipeline_depth = 2;
  opts.small_all_reduce_bytes = 16;
  for (const int size : {1, 2, 3, 5}) {
    on_ranks(size, opts, [size](int r, communicator& c) {
      for (const size_t count : {0, 1, 2, 3, 4, 5, 6, 7, 17, 100, 1001}) {
        for (const auto op : {reduce_op::sum, reduce_op::average}) {
          auto v = test::contributions(r, count);
          c.all_reduce(v.data(), count, op, {10s});
          EXPECT_EQ(test::check_reduced(v, size, op), "")
              << "size " << size << " count " << count << " rank " << r;
        }
      }
    });
  }
}

TEST(gloo_threads, broadcast_chain_and_star_from_every_root) {
  gloo_options opts;
  opts.segment_bytes = 100;
  opts.small_broadcast_bytes = 50;
  on_ranks(4, opts, [](int r, communicator& c) {
    for (const size_t bytes : {1, 49, 50, 51, 99, 100, 101, 1000}) {
      for (int root = 0; root < 4; ++root) {
        std::vector<char> b(bytes, 0);
        if (r == root) {
          for (size_t i = 0; i < bytes; ++i) b[i] = test::broadcast_byte(root, i);
        }
        c.broadcast(b.data(), bytes, root, {10s});
        for (size_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(b[i], test::broadcast_byte(root, i)) << bytes << " bytes, root " << root;
        }
      }
    }
  });
}

TEST(gloo_threads, barrier_and_invalid_arguments) {
  on_ranks(3, {}, [](int, communicator& c) {
    for (int i = 0; i < 10; ++i) c.barrier({10s});
    try {
      c.broadcast(nullptr, 0, 3, {1s});
      FAIL() << "root 3 of 3 accepted";
    } catch (const comm_error& e) {
      EXPECT_EQ(e.code(), comm_errc::invalid);
    }
    EXPECT_THROW(c.barrier({0ms}), comm_error);
    c.barrier({10s});  // invalid arguments do not kill the communicator
  });
}

TEST(gloo_threads, ranks_that_disagree_time_out_instead_of_mixing_data) {
  on_ranks(2, {}, [](int r, communicator& c) {
    // Different sizes on the two ranks (both small-message and ring sized).
    std::vector<float> v(r == 0 ? 1000 : 1001, 1.0f);
    try {
      c.all_reduce(v.data(), v.size(), reduce_op::sum, {500ms});
      FAIL() << "all_reduce of mismatched sizes succeeded";
    } catch (const comm_error& e) {
      // The first rank to time out closes its connections; the other may see that first.
      EXPECT_TRUE(e.code() == comm_errc::timeout || e.code() == comm_errc::peer_lost) << e.what();
    }
  });
  on_ranks(2, {}, [](int r, communicator& c) {
    char b = 0;
    try {
      if (r == 0) {
        c.barrier({500ms});
      } else {
        c.broadcast(&b, 1, 0, {500ms});
      }
      FAIL() << "a barrier matched a broadcast";
    } catch (const comm_error& e) {
      EXPECT_TRUE(e.code() == comm_errc::timeout || e.code() == comm_errc::peer_lost) << e.what();
    }
  });
}

}  // namespace
