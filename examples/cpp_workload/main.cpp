// The linear workload driven by hand at world 1, the way the runtime drives it (compute, then
// apply once the step committed): what a user runs to debug a workload without a job. Exits
// 0 when the loss fell to a twentieth of the first step's.

#include <cstdio>

#include "linear_workload.hpp"

int main() {
  troupe::job_settings job;
  job.steps = 200;
  job.last_step = 200;
  job.global_batch = 64;
  job.micro_batch = 16;
  job.seed = 1337;
  linear::workload w(job);
  troupe::generation_env env;
  env.share = {0, job.global_batch, job.micro_batch};
  env.global_batch = job.global_batch;
  auto gen = w.make_generation(env);
  gen->init(job.seed);
  double first = 0, last = 0;
  for (int64_t step = 1; step <= job.steps; ++step) {
    troupe::step_work work;
    work.step = step;
    work.data_position = step - 1;
    work.share = env.share;
    work.global_batch = job.global_batch;
    work.seed = job.seed;
    const troupe::step_outcome out = gen->compute(work);
    gen->apply({step, job.steps, {}});
    last = out.loss_sum / static_cast<double>(out.count);
    if (step == 1) first = last;
    if (step % 50 == 0) std::printf("step %lld loss %.6f\n", static_cast<long long>(step), last);
  }
  const troupe::state_view state = gen->state();
  std::printf("trained %s: %zu tensors, %zu bytes of state; loss %.6f -> %.6f\n",
              w.traits().name.c_str(), state.tensors.size(), state.bytes(), first, last);
  return last < first / 20 ? 0 : 1;
}
