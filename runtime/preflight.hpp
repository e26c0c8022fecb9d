#pragma once
// The checks of a job against the machine it starts on, before anything starts: memory for
// the model, optimizer and activations of every local rank, and a corpus that can feed a
// batch and the validation estimate. The decisions are pure; reading the machine is apart.

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/config.hpp"

namespace troupe {

/// What the machine offers, read once (read_host_facts) or made up by a test.
struct host_facts {
  uint64_t memory_bytes = 0;  ///< memory the job may use; 0 = unknown (no memory check)
  std::string memory_source;  ///< where memory_bytes came from, for the message
  int64_t data_tokens = -1;   ///< tokens of cfg.data (bytes of text); -1 = unknown (no checks)
  int64_t val_tokens = -1;    ///< tokens of cfg.val_data; -1 = none (a share of cfg.data)
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

/// Throws config_error, naming `key` and `flag` ("data", "--data"), when `path` cannot be opened
/// for its length alone: longer than PATH_MAX less its terminating NUL, or with a component
/// longer than NAME_MAX. The kernel would say only "File name too long", and only when the
/// path is first used. A relative path is checked as given: pass what will be opened.
void check_path_length(const std::string& path, const std::string& key, const std::string& flag);

/// Bytes of the longest path troupe writes below a run directory,
/// "/checkpoints/recycled-chunks/<32 hex digits>.tmp.<pid>.<counter>" (94 with a 7-digit pid
/// and a 20-digit counter), with room to spare.
inline constexpr size_t run_dir_headroom = 128;

/// check_path_length for the run directory (its absolute path), keeping run_dir_headroom bytes
/// of PATH_MAX for the paths written below it, and in its last component room for the
/// ".prev-<seconds>" suffix an earlier run is archived under.
void check_run_dir_length(const std::string& absolute_run_dir);

/// The processes of a job, for the descriptors each needs.
enum class process_role { coordinator, agent, worker };

/// Open descriptors one process of this job holds at most, by role, generously: see the
/// formula and what it was measured against in preflight.cpp. The coordinator's count includes
/// the reserve its listeners keep free (runtime/sys/descriptors.hpp).
long descriptors_needed(const train_config& cfg, process_role role);

/// Throws config_error when a limit on open files of `soft` (RLIMIT_NOFILE, after raising it
/// as far as `hard` allows) is below `needed`: it names the limit, the need and the fix
/// (`ulimit -n N`). `who` says whose need it is ("the job (world 2)").
void check_descriptor_limit(long needed, long soft, long hard, const std::string& who);

/// Reads the memory this process may use (MemAvailable, else MemTotal, of /proc/meminfo,
/// capped by a cgroup v2 memory.max) and checks that cfg.data is a readable, non-empty
/// regular file; throws config_error naming the file when it is not.
host_facts read_host_facts(const train_config& cfg);

}  // namespace troupe
