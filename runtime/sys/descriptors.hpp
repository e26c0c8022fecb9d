#pragma once
// Descriptors as a budget: a process raises its limit once at start, and every listener
// leaves a reserve free, so that however many clients connect, a checkpoint can still open
// its files and the data plane its sockets.

namespace troupe::sys {

/// The soft and hard RLIMIT_NOFILE of this process (an infinite one as 2^20).
struct descriptor_limits {
  long soft = 0;
  long hard = 0;
};
descriptor_limits read_descriptor_limits();

/// Raises the soft RLIMIT_NOFILE to the hard limit (at most 2^20) and returns the soft limit
/// now in force. Never lowers it; on failure returns the limit as it was.
long raise_descriptor_limit();

/// Descriptors a listener leaves free: a quarter of the limit, at most 256.
long descriptor_reserve();

/// Whether a descriptor just accepted eats into the reserve. The kernel hands out the lowest
/// free number, so `fd` at or above limit - reserve means fewer than the reserve are left:
/// the listener should close it at once.
bool in_descriptor_reserve(int fd);

/// Marks `fd` close-on-exec (for descriptors made by libraries that do not, e.g. Asio's).
void set_close_on_exec(int fd);

}  // namespace troupe::sys
