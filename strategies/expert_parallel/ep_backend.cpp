// Placeholder until the expert backend lands.
#include "strategies/engine_backend.hpp"

#include <stdexcept>

namespace troupe::strategies {

std::unique_ptr<engine_backend> make_expert_backend(const train_config&, const layout& shape, int, uint64_t,
                                                    const connect_fn&) {
  throw std::invalid_argument("layout " + describe(shape) + ": expert parallelism is not wired into the step loop yet");
}

}  // namespace troupe::strategies
