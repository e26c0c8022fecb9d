#include "actors/worker/program_worker.hpp"

#include <openssl/crypto.h>

#include <stdexcept>

#include "actors/worker/rank.hpp"
#include "actors/worker/worker_environment.hpp"

namespace troupe {

bool started_by_troupe() { return actors::started_by_agent(); }

int run_as_worker(const workload_factory& make) {
  if (!make) throw std::invalid_argument("run_as_worker: no workload factory");
  // As in the troupe binary (cli/main.cpp): OpenSSL's cleanup at exit would free the
  // thread-local state of the worker's detached threads while they may still be exiting.
  OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr);
  return actors::run_worker(actors::worker_args_from_environment(), make);
}

}  // namespace troupe
