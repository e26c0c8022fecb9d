#pragma once
// A worker process: one `rank` actor that joins the job, builds its communicators and
// runs the step loop (compute, all-reduce, vote, apply on commit, checkpoint, evaluate).

#include <cstdint>
#include <string>

namespace troupe::actors {

struct worker_args {
  std::string coordinator_host = "127.0.0.1";
  uint16_t coordinator_port = 0;
  int rank = -1;
  int connect_timeout_ms = 30000;
};

/// Runs the worker until the job stops it; returns the process exit code
/// (0 stopped normally, 1 failed; the reason is logged).
int run_worker(const worker_args& args);

}  // namespace troupe::actors
