// The NCCL communicator on one GPU (a group of one rank): create, collectives on device
// memory, abort. Skipped where no CUDA device is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "runtime/comm/nccl_communicator.hpp"
#include "runtime/comm/store.hpp"

using namespace troupe::comm;
using namespace std::chrono_literals;

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(nccl, single_rank_collectives_and_abort) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  tcp_store_server server;
  auto store = connect_tcp_store("127.0.0.1", server.port(), 5s);
  auto c = make_nccl_communicator(*store, {1, "world", 0, 1}, 0);

  const size_t count = (size_t{1} << 20) + 3;
  std::vector<float> host(count);
  for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>(i % 13);
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), count * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  c->all_reduce(dev, count, reduce_op::sum, {30s});
  c->all_reduce(dev, count, reduce_op::average, {30s});
  c->broadcast(dev, count * sizeof(float), 0, {30s});
  c->barrier({30s});
  std::vector<float> back(count);
  ASSERT_EQ(cudaMemcpy(back.data(), dev, count * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back, host);  // one rank: sum and average are the identity

  c->abort();
  EXPECT_TRUE(c->aborted());
  try {
    c->barrier({1s});
    FAIL() << "an aborted communicator accepted another op";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::aborted);
  }
  cudaFree(dev);
}

TEST(nccl, single_rank_scatter_gather_and_exchange_are_copies) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  tcp_store_server server;
  auto store = connect_tcp_store("127.0.0.1", server.port(), 5s);
  auto c = make_nccl_communicator(*store, {1, "world", 0, 1}, 0);
  const size_t count = 1001;
  std::vector<float> host(count);
  for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>(i % 17);
  float* a = nullptr;
  float* b = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&a), count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&b), count * sizeof(float)), cudaSuccess);
  auto round_trip = [&](auto&& op) {
    ASSERT_EQ(cudaMemcpy(a, host.data(), count * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemset(b, 0, count * sizeof(float)), cudaSuccess);
    op();
    std::vector<float> back(count);
    ASSERT_EQ(cudaMemcpy(back.data(), b, count * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(back, host);
  };
  round_trip([&] { c->reduce_scatter(a, b, count, reduce_op::average, {30s}); });
  round_trip([&] { c->all_gather(a, b, count * sizeof(float), {30s}); });
  round_trip([&] { c->all_to_all(a, b, count * sizeof(float), {30s}); });
  round_trip(
      [&] { c->all_to_allv(a, {count * sizeof(float)}, b, {count * sizeof(float)}, {30s}); });
  EXPECT_THROW(c->send(a, 4, 0, 1, {1s}), comm_error);  // no peer in a group of one
  cudaFree(a);
  cudaFree(b);
}

}  // namespace
