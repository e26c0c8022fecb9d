#include "strategies/engine.hpp"

namespace troupe::strategies {

training_engine::training_engine(const train_config& cfg, const layout& shape, int rank,
                                 uint64_t generation, const connect_fn& connect,
                                 const micro_batching& batching) {
  require_layout(shape);
  if (cfg.model.experts > 0 || shape.ep > 1) {
    backend_ = make_expert_backend(cfg, shape, rank, generation, connect, batching);
  } else if (shape.pp > 1 || (shape.tp > 1 && cfg.parallel.zero == 1)) {
    backend_ = make_pipeline_backend(cfg, shape, rank, generation, connect, batching);
  } else {
    backend_ = make_dense_backend(cfg, shape, rank, generation, connect, batching);
  }
}

}  // namespace troupe::strategies
