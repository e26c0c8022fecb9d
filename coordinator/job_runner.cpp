// A job's coordinator process in its steps (coordinator/job_steps.hpp): plan the job, open the
// listeners, prepare the run directory, reach etcd (--etcd), supervise the job, summarise it.

#include "coordinator/job_runner.hpp"

#include <pthread.h>
#include <signal.h>

#include <cstdarg>
#include <cstdio>

#include "coordinator/job_steps.hpp"
#include "monitoring/log.hpp"
#include "runtime/sys/signal_route.hpp"

namespace troupe::coordinator {
namespace {

// Signals are taken by one thread with sigwait (job_supervision::run); blocked here, before
// any thread starts, so a Ctrl-C never lands on a server thread and kills the process
// mid-write.
// One of several coordinators (--join-token) also takes launcher_died.
sigset_t block_job_signals(bool launched) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  if (launched) sigaddset(&signals, launcher_died);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A library's thread born before main (OpenBLAS) does not block them: handed on from there.
  if (launched)
    troupe::sys::route_signals({SIGINT, SIGTERM, SIGUSR1, launcher_died});
  else
    troupe::sys::route_signals({SIGINT, SIGTERM, SIGUSR1});
  return signals;
}

}  // namespace

void say(const char* format, ...) {
  char text[2048];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  monitoring::log(monitoring::level::info, {.role = "coordinator"}, text);
}

int run_job(const job_options& opts, bool launch_local_agent) {
  const sigset_t signals = block_job_signals(!opts.join_token.empty());
  if (launch_local_agent && opts.coordinators > 1)
    return run_with_standby_coordinators(opts, signals);
  job_plan job = plan_job(opts, launch_local_agent);
  job.standby = !opts.join_token.empty();
  check_etcd_options(job.cfg);
  job_listeners listeners(job.cfg);
  run_dir_state run = job.standby ? join_run_dir(job, opts.join_token) : prepare_run_dir(job);
  job_etcd etcd(job.cfg, listeners.registry(), run.events);
  job_supervision supervision(job, listeners, run, etcd);
  const actors::job_result result = supervision.run(signals);
  if (result.exit_code == actors::exit_code::not_leading) {  // another coordinator goes on
    std::fprintf(stderr, "troupe coordinator: %s\n", result.message.c_str());
    return result.exit_code;
  }
  print_summary(job.cfg, result);
  return result.exit_code;
}

}  // namespace troupe::coordinator
