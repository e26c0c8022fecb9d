#include "actors/wire/welcome_verdict.hpp"

namespace troupe::actors {

welcome_verdict judge_welcome(const welcome& w, int64_t epoch_seen) {
  if (w.error.starts_with(not_leading_prefix)) return welcome_verdict::not_leading;
  if (w.error.starts_with(removed_prefix) || w.error.starts_with(evicted_prefix))
    return welcome_verdict::told_to_go;
  if (!w.error.empty()) return welcome_verdict::refused;
  if (from_older_epoch(w.epoch, epoch_seen)) return welcome_verdict::stale;
  return welcome_verdict::leader;
}

}  // namespace troupe::actors
