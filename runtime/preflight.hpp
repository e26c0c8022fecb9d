#pragma once
// The checks of a job against the machine it starts on, before anything starts: memory for
// the model, optimizer and activations of every local rank, and a corpus that can feed a
// batch and the validation estimate. The decisions are pure; reading the machine is apart.

#include <cstdint>
#include <string>

#include "runtime/config.hpp"

namespace troupe {

/// What the machine offers, read once (read_host_facts) or made up by a test.
struct host_facts {
  uint64_t memory_bytes = 0;  ///< memory the job may use; 0 = unknown (no memory check)
  std::string memory_source;  ///< where memory_bytes came from, for the message
  int64_t data_bytes = -1;    ///< size of cfg.data; -1 = unknown (no corpus checks)
};

/// At least the bytes one rank holds: fp32 parameters, gradients and AdamW's two moments of
/// its share of the model (tp, pp, ep and ZeRO-1 divide it), plus the activations and their
/// gradients for one micro-batch. Computed in double, so no shape can overflow it.
double estimate_rank_bytes(const train_config& cfg);

/// Throws config_error when `local_ranks` ranks of this config cannot fit facts.memory_bytes
/// ("needs X GiB, this machine has Y GiB"), when the corpus's training split holds fewer
/// windows than one batch has sequences, or when its validation split holds fewer windows
/// than the validation estimate reads (eval_batches x micro_batch). Each message names the
/// options to change.
void check_against_host(const train_config& cfg, int local_ranks, const host_facts& facts);

/// Reads the memory this process may use (MemAvailable, else MemTotal, of /proc/meminfo,
/// capped by a cgroup v2 memory.max) and checks that cfg.data is a readable, non-empty
/// regular file; throws config_error naming the file when it is not.
host_facts read_host_facts(const train_config& cfg);

}  // namespace troupe
