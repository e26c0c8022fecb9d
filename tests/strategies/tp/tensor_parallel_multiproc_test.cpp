// Tensor parallelism across process boundaries: tp ranks as tp_peer processes over gloo,
// against the single-rank GPT computed here.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/comm/store.hpp"
#include "runtime/model/gpt.hpp"
#include "runtime/optim/adamw.hpp"
#include "tests/runtime/comm/child_process.hpp"
#include "tests/strategies/tp/tp_fixtures.hpp"

namespace troupe::tensor_parallel {
namespace {

using namespace std::chrono_literals;

// Same check as the thread test's: loss to 1e-5 relative, every gradient element to 1e-4
// relative (absolute 1e-6 for tiny values), for tp = 2 and 4 processes.
TEST(tensor_parallel_multiproc, processes_match_single_rank_gpt) {
  const model_config cfg = test::small_config();
  const test::batch b(3, 12, 5);
  gpt ref(cfg);
  ref.init_params(42);
  test::perturb(ref.params(), ref.num_params());
  ref.zero_grads();
  const double ref_loss = ref.forward_backward(b.inputs.data(), b.targets.data(), b.B, b.T, 0.75f);
  const double ref_norm = adamw::grad_norm(ref.grads(), ref.num_params());

  for (const int t : {2, 4}) {
    SCOPED_TRACE("tp = " + std::to_string(t));
    const std::filesystem::path out =
        std::filesystem::temp_directory_path() /
        ("tp_peer_" + std::to_string(::getpid()) + "_" + std::to_string(t) + ".bin");
    std::filesystem::remove(out);
    comm::tcp_store_server server;
    std::vector<troupe::test::child_process> peers;
    peers.reserve(static_cast<size_t>(t));
    for (int r = 0; r < t; ++r) {
      peers.push_back(troupe::test::child_process::spawn(
          {TP_PEER_PATH, "127.0.0.1:" + std::to_string(server.port()), std::to_string(r),
           std::to_string(t), out.string()}));
    }
    for (auto& p : peers) {
      const auto status = p.wait_exit(120s);
      ASSERT_TRUE(status.has_value()) << "a tp_peer did not finish in time";
      ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "tp_peer failed";
    }
    std::FILE* f = std::fopen(out.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    double loss = 0, norm = 0;
    std::vector<float> full(ref.num_params());
    const bool ok = std::fread(&loss, sizeof loss, 1, f) == 1 &&
                    std::fread(&norm, sizeof norm, 1, f) == 1 &&
                    std::fread(full.data(), sizeof(float), full.size(), f) == full.size();
    std::fclose(f);
    std::filesystem::remove(out);
    ASSERT_TRUE(ok) << "short result file";
    EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss);
    EXPECT_NEAR(norm, ref_norm, 1e-5 * ref_norm);
    for (const param_tensor& p : ref.param_table()) {
      for (size_t i = 0; i < p.numel; ++i) {
        const double want = ref.grads()[p.offset + i];
        const double e = std::abs(full[p.offset + i] - want);
        ASSERT_TRUE(e <= 1e-4 * std::abs(want) || e <= 1e-6)
            << p.name << "[" << i << "] got " << full[p.offset + i] << " want " << want;
      }
    }
  }
}

}  // namespace
}  // namespace troupe::tensor_parallel
