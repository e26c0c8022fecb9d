#pragma once
// Process signals for the one thread that waits for them. A process takes SIGINT, SIGTERM and
// SIGUSR1 with sigwait in one thread and blocks them everywhere else, but a thread a library
// started before main (OpenBLAS's pool) keeps the empty mask it was born with, and the kernel
// may pick it for a process-directed signal: its default action would end the process. The
// handler installed here runs in such a thread and hands the signal on to the waiting thread.

#include <initializer_list>

namespace troupe::sys {

/// Installs the hand-on handler for `signals` (before any of them can matter). A signal that
/// arrives before a thread waits for it takes its default action, as if nothing were
/// installed.
void route_signals(std::initializer_list<int> signals);

/// Called by the thread that sigwaits: from now on routed signals go to it.
void wait_here_for_signals();

/// That thread is about to end because the process is: routed signals are dropped from now on
/// (a late duplicate SIGTERM must not turn an exit code into a death by signal).
void stop_waiting_for_signals();

}  // namespace troupe::sys
