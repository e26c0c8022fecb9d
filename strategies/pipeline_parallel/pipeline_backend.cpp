// Placeholder until the pipeline backend lands.
#include "strategies/engine_backend.hpp"

#include <stdexcept>

namespace troupe::strategies {

std::unique_ptr<engine_backend> make_pipeline_backend(const train_config&, const layout& shape, int, uint64_t,
                                                      const connect_fn&) {
  throw std::invalid_argument("layout " + describe(shape) + ": pipeline parallelism is not wired into the step loop yet");
}

}  // namespace troupe::strategies
