// The linear workload as the workers of a troupe job, through the runtime installed beside
// the workload interface (troupe::program):
//
//   troupe run --world 2 --steps 200 --batch 64 --micro-batch 16 -- ./linear_train
//
// Every guarantee of a troupe job holds: a worker killed (kill -9) or cut off is replaced and
// the step it interrupted is redone with the same samples, state comes from a peer, and
// checkpoints go to troupe's store. linear_workload (main.cpp) trains the same model alone.

#include <cstdio>
#include <memory>

#include "actors/worker/program_worker.hpp"
#include "linear_workload.hpp"

int main(int argc, char** argv) {
  if (!troupe::started_by_troupe()) {
    const char* self = argc > 0 ? argv[0] : "linear_train";
    std::fprintf(stderr,
                 "%s: this program is a troupe job's worker: troupe run --world 2 -- %s "
                 "(linear_workload trains the same model alone)\n",
                 self, self);
    return 2;
  }
  return troupe::run_as_worker(
      [](const troupe::job_settings& job) { return std::make_unique<linear::workload>(job); });
}
