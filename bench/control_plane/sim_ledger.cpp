#include "bench/control_plane/sim_ledger.hpp"

#include <sys/mman.h>

#include <new>
#include <stdexcept>

namespace troupe::bench::control_plane {

std::unique_ptr<sim_ledger, void (*)(sim_ledger*)> sim_ledger::create_shared(int members,
                                                                             int64_t steps,
                                                                             int32_t first_member) {
  const size_t n = static_cast<size_t>(members), s = static_cast<size_t>(steps) + 2;
  const size_t head = (sizeof(sim_ledger) + 63) / 64 * 64;
  const size_t member_bytes = (n * sizeof(member_record) + 63) / 64 * 64;
  const size_t bytes = head + member_bytes + s * sizeof(step_record);
  void* at = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (at == MAP_FAILED) throw std::runtime_error("cannot map the simulation's shared ledger");
  auto* base = static_cast<char*>(at);
  auto* ledger = new (base) sim_ledger();
  ledger->first_member_ = first_member;
  ledger->member_count_ = n;
  ledger->step_count_ = s;
  ledger->mapped_bytes_ = bytes;
  ledger->members_ = reinterpret_cast<member_record*>(base + head);
  for (size_t i = 0; i < n; ++i) new (&ledger->members_[i]) member_record();
  ledger->steps_ = reinterpret_cast<step_record*>(base + head + member_bytes);
  for (size_t i = 0; i < s; ++i) new (&ledger->steps_[i]) step_record();
  static_assert(std::atomic<int64_t>::is_always_lock_free, "shared atomics must be lock-free");
  return {ledger, [](sim_ledger* l) { ::munmap(l, l->mapped_bytes_); }};
}

}  // namespace troupe::bench::control_plane
