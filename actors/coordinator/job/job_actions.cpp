#include "actors/coordinator/job/job_actions.hpp"

namespace troupe::actors {

const char* to_string(job_state s) {
  switch (s) {
    case job_state::forming:
      return "forming";
    case job_state::training:
      return "training";
    case job_state::recovering:
      return "recovering";
    case job_state::done:
      return "done";
    case job_state::failed:
      return "failed";
  }
  return "unknown";
}

const char* to_string(loss_cause c) {
  switch (c) {
    case loss_cause::exit:
      return "exit";
    case loss_cause::connection:
      return "connection";
    case loss_cause::hang:
      return "hang";
    case loss_cause::straggler:
      return "straggler";
    case loss_cause::error:
      return "error";
  }
  return "unknown";
}

}  // namespace troupe::actors
