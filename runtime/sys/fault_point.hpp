#pragma once
// The named points where a lower layer lets chaos/ inject a fault: the code at a point calls
// hit(); what happens there (nothing, unless chaos/ installed a hook) is chaos/'s business.
// Header-only so that every layer can reach it without a link; chaos/hooks.hpp sets it.

#include <atomic>
#include <cstdint>

namespace troupe::sys {

/// Every injection point a layer below chaos/ offers, by name.
enum class fault_point : uint8_t {
  /// A checkpoint commit whose shards are verified, just before its manifest is written
  /// (checkpoint/writer.cpp); `step` is the checkpoint's step.
  checkpoint_before_manifest,
};

/// What chaos/ runs at a point; called on the thread that reached it.
using fault_hook = void (*)(fault_point point, int64_t step);

namespace detail {
inline std::atomic<fault_hook> installed_fault_hook{nullptr};
}  // namespace detail

/// Installs (or, with nullptr, removes) the process's hook. Only chaos/ calls this.
inline void set_fault_hook(fault_hook hook) {
  detail::installed_fault_hook.store(hook, std::memory_order_release);
}

/// Marks that `point` is reached at `step`: runs the installed hook, if any.
inline void hit(fault_point point, int64_t step) {
  if (const fault_hook hook = detail::installed_fault_hook.load(std::memory_order_acquire))
    hook(point, step);
}

}  // namespace troupe::sys
