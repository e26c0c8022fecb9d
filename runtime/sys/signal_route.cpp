#include "runtime/sys/signal_route.hpp"

#include <pthread.h>

#include <atomic>
#include <csignal>

namespace troupe::sys {
namespace {

enum : int { nobody = 0, waiting = 1, done = 2 };
std::atomic<int> state{nobody};
pthread_t waiter{};  // written before `state` becomes waiting, read after it is seen so

void hand_on(int sig) {
  const int now = state.load(std::memory_order_acquire);
  if (now == done) return;  // the process is ending on its own terms
  if (now == waiting && !pthread_equal(pthread_self(), waiter)) {
    ::pthread_kill(waiter, sig);  // blocked there and sigwaited for: it takes it next
    return;
  }
  ::signal(sig, SIG_DFL);  // nobody waits yet: what the signal would have done anyway
  ::raise(sig);
}

}  // namespace

void route_signals(std::initializer_list<int> signals) {
  for (int sig : signals) {
    struct sigaction sa {};
    sa.sa_handler = &hand_on;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

void wait_here_for_signals() {
  waiter = ::pthread_self();
  state.store(waiting, std::memory_order_release);
}

void stop_waiting_for_signals() { state.store(done, std::memory_order_release); }

}  // namespace troupe::sys
