// One tensor-parallel rank in its own process, for tensor_parallel_multiproc_test:
//
//   tp_peer HOST:PORT RANK SIZE OUT_PATH
//
// connects to the test's store, builds its shard of the fixture model, runs one
// forward/backward on the fixture batch, and rank 0 writes the loss, the clipping norm and
// the gradients gathered to the single-rank layout to OUT_PATH. Exit 0 on success.

#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "runtime/model/gpt.hpp"
#include "runtime/trainer.hpp"
#include "strategies/tensor_parallel/tp_gpt.hpp"
#include "tests/strategies/tp/tp_fixtures.hpp"

using namespace troupe;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: tp_peer HOST:PORT RANK SIZE OUT_PATH\n";
    return 2;
  }
  const std::string address = argv[1];
  const int rank = std::stoi(argv[2]);
  const int size = std::stoi(argv[3]);
  try {
    set_blas_threads(1);
    const auto colon = address.rfind(':');
    auto store = comm::connect_tcp_store(
        address.substr(0, colon), static_cast<uint16_t>(std::stoi(address.substr(colon + 1))), 10s);
    auto c = comm::make_gloo_communicator(*store, {1, "tp", rank, size});
    tensor_parallel::tp_gpt m(tensor_parallel::test::small_config(), *c, {30s});
    // The fixture model: gpt::init_params(42) perturbed, loaded from the full layout.
    gpt full_model(tensor_parallel::test::small_config());
    full_model.init_params(42);
    tensor_parallel::test::perturb(full_model.params(), full_model.num_params());
    m.load_from_full(full_model.params());
    m.zero_grads();
    const tensor_parallel::test::batch b(3, 12, 5);
    const double loss = m.forward_backward(b.inputs.data(), b.targets.data(), b.B, b.T, 0.75f);
    const double norm = m.global_grad_norm();
    std::vector<float> full(m.full_num_params());
    m.gather_full_grads(full.data());
    if (rank == 0) {
      std::FILE* f = std::fopen(argv[4], "wb");
      if (f == nullptr) throw std::runtime_error(std::string("cannot write ") + argv[4]);
      const bool ok = std::fwrite(&loss, sizeof loss, 1, f) == 1 &&
                      std::fwrite(&norm, sizeof norm, 1, f) == 1 &&
                      std::fwrite(full.data(), sizeof(float), full.size(), f) == full.size();
      if (std::fclose(f) != 0 || !ok) throw std::runtime_error("short write");
    }
    c->barrier({30s});  // nobody closes its connections while a peer still gathers
  } catch (const std::exception& e) {
    std::cerr << "tp_peer rank " << rank << "/" << size << ": " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
