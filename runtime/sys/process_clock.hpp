#pragma once
// When this process started, on the steady clock: the start of a job's time accounting when
// its coordinator is the process that began the job.

#include <chrono>

namespace troupe::sys {

/// The steady clock's reading as the process started (before main, with its static objects).
std::chrono::steady_clock::time_point process_started();

/// Records that this process began a job now (it logged the job's start); job_started() then
/// answers with that instant, and before it with process_started().
void mark_job_started();
std::chrono::steady_clock::time_point job_started();

}  // namespace troupe::sys
