#pragma once
// What a coordinator's answer to a member's hello means to a member looking for the leader:
// the vocabulary the worker and the agent share when they ask the job's coordinators in turn.

#include <cstddef>
#include <cstdint>

#include "actors/wire/messages.hpp"

namespace troupe::actors {

/// Whether a message stamped with leadership `epoch` comes from a coordinator older than the
/// one this member follows (`seen`). Equal epochs pass: one coordinator without etcd is 0.
inline bool from_older_epoch(int64_t epoch, int64_t seen) { return epoch < seen; }

/// What a coordinator's answer to a member's hello means for a member looking for the leader.
enum class welcome_verdict {
  leader,       ///< it leads and took the member on
  not_leading,  ///< a standby (or a deposed leader): ask the next one
  stale,        ///< it leads an epoch older than one the member followed already: ask the next
  refused,      ///< it leads but refused the member for another reason
  /// it leads, and declared this member lost while the process was away (removed_prefix) or
  /// evicted it (evicted_prefix): the process exits, and its agent starts a removed one again
  told_to_go,
};
welcome_verdict judge_welcome(const welcome& w, int64_t epoch_seen);

}  // namespace troupe::actors
