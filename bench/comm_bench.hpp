#pragma once
// The collectives benchmark (`troupe bench comm`): nccl-tests-style tables of time, algbw and
// busbw for the CPU data plane (gloo over TCP, shared memory), with ranks as real processes on
// this machine.

#include <string>
#include <vector>

namespace troupe::bench {

/// Runs the benchmark and prints its tables to stdout; returns the process exit status
/// (0 on success, 2 for bad arguments, 1 if a rank failed). `args` are the options after
/// `bench comm`:
///
///   --ranks 2,4                                 group sizes to run, one after another
///   --ops all_reduce,all_gather,reduce_scatter,all_to_all
///   --min-bytes 4K --max-bytes 256M             sizes, multiplied by 4 each step
///   --batches 5                                 timed batches per size; the median is shown
///   --batch-seconds 0.2                         about how long one batch runs
///   --transport tcp                             tcp (gloo), shm, or tcp,shm for both in turn
///
/// The ranks are forked from the calling process, which must not have started threads yet
/// (a CLI entry point before anything else runs is fine); it serves their store meanwhile.
int run_comm_bench(const std::vector<std::string>& args);

}  // namespace troupe::bench
