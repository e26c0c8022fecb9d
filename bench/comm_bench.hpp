#pragma once
// The collectives benchmark (`troupe bench comm`): nccl-tests-style tables of time, algbw and
// busbw for the CPU data plane (gloo over TCP, shared memory, shm inside simulated nodes and
// TCP across), with ranks as real processes on this machine.

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
///   --transport tcp                             tcp (gloo), tcp-signed, shm, hier, or a list
///   --nodes 2                                   hier: simulated nodes, consecutive ranks each
///
/// Across real nodes (network namespaces or hosts; chaos/netns, bench/cross_node_bench.py),
/// one invocation per node, each forking only its node's ranks:
///
///   --node K                                    this process runs node K's ranks (of --nodes)
///   --serve-store HOST:PORT | --store HOST:PORT the ranks meet in a store at HOST:PORT, which
///                                               one node's invocation serves
///   --bind ADDR                                 address the gloo pairs listen on (default
///                                               127.0.0.1; across nodes, this node's address)
///
/// Each row ends with `calls`, how often the op ran at that size, so that a harness can divide
/// the bytes it counted on a link by op.
///
/// The ranks are forked from the calling process, which must not have started threads yet
/// (a CLI entry point before anything else runs is fine); it serves their store meanwhile.
int run_comm_bench(const std::vector<std::string>& args);

}  // namespace troupe::bench
