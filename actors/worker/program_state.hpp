#pragma once
// Inside a worker whose job runs a program of the user's (workload.command): its state in
// troupe's checkpoint store. The program's tensors (any dtype, each in its own memory) are
// packed per state array (model, optim, extra) into one buffer of 4-byte words, as the chunk
// writer and restore_into read them; a restore unpacks them into the room the program made
// (begin_restore) and hands them over (end_restore). The coordinator records the table and the
// extras in a format 3 manifest.

#include <array>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "runtime/workload/workload.hpp"

namespace troupe::actors {

struct packed_state {
  ckpt::state_map map;
  std::array<std::vector<float>, ckpt::workload_array_names.size()> words;
  /// The buffers as the checkpoint writer and restore take them.
  std::vector<std::span<const float>> readable() const;
  std::vector<std::span<float>> writable();
};

/// Packs `view` (one region per tensor, in table order): its bytes, and a piece per box, at its
/// word offset in its array's buffer. With `whole`, every box is one rank's alone (a restore
/// reads whole tensors), else the replicas split the writing as the view says. Throws
/// workload_error for a tensor of another state array.
packed_state pack_program_state(const state_view& view, bool whole);

/// Restores checkpoint `man` (format 3, a program's) into `gen`: its table and extras first
/// (begin_restore), then every tensor's words, verified, then end_restore; cancel_restore when
/// anything fails. Throws ckpt::checkpoint_error on damage, workload_error when the program
/// cannot take the state.
ckpt::restore_stats restore_program_checkpoint(workload_generation& gen, const std::string& run_dir,
                                               const ckpt::manifest& man,
                                               const ckpt::memory_source& memory);

}  // namespace troupe::actors
