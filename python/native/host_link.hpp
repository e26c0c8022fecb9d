#pragma once
// Inside a Python worker process: the meeting point of the script's thread, which runs the
// user's forward, backward and optimizer, and the runtime's rank thread, which runs the step
// transaction (actors/worker/rank.cpp) and calls the workload. The rank thread asks (a step to
// compute, an apply, a restore to make room for); the script thread answers. Nothing here
// touches a Python object: the script thread hands over raw memory and plain values.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/workload/workload.hpp"

namespace troupe::python {

/// What the rank thread asks of the script.
enum class ask_kind {
  step,            ///< compute this step's share: forward and backward into the buckets
  apply,           ///< the step committed: run the optimizer
  init,            ///< restore the state the script started with (a replay from step 0)
  begin_restore,   ///< make room for `tensors` (scratch memory) and register it
  end_restore,     ///< load the scratch memory into the model, optimizer and extras
  cancel_restore,  ///< drop the scratch memory
  state,           ///< register the state's memory now (the live tensors, or the scratch)
  ended,           ///< the worker's session ended (code, why); nothing follows
};

struct ask {
  ask_kind kind = ask_kind::ended;
  uint64_t generation = 0;
  int rank = 0;
  int world = 1;
  step_work work;                    ///< step: its number, batch, share and seed
  std::vector<tensor_decl> tensors;  ///< begin_restore
  std::string extras_json;           ///< begin_restore
  int exit_code = 0;                 ///< ended
  std::string why;                   ///< ended
  double job_loss = 0;               ///< apply: the job's mean loss of the step
  bool finished = false;             ///< ended: the session's last step is done
};

/// The script's answer to an ask: empty `error` = done.
struct answer {
  std::string error;
  double loss_sum = 0;  ///< step
  int64_t count = 0;    ///< step
};

/// A tensor of the script's state: its declaration and its memory (CPU, contiguous).
struct held_tensor {
  tensor_decl decl;
  std::byte* data = nullptr;
};

class host_link {
 public:
  // ---- the rank thread
  /// Hands `a` to the script and waits for its answer. Throws workload_error with the
  /// script's words when it answered with an error, or when the script has failed or left.
  answer request(ask a);
  /// The session is over: the script's wait returns `ended` from now on.
  void end(int exit_code, std::string why, bool finished);
  /// The generation the script computes for was aborted (any thread).
  void set_superseded(bool yes) { superseded_.store(yes); }
  /// Where the script's gradient hooks announce finished buckets during this step's compute
  /// (null outside it, and at world 1).
  void set_sink(gradient_sink* sink) { sink_.store(sink); }

  // ---- the script thread
  /// Waits for the next ask (the GIL released by the caller).
  ask next();
  /// Answers the ask that next() returned.
  void reply(answer a);
  /// The script raised or left: every wait of the rank thread fails with `why` from now on.
  void fail(std::string why);
  [[nodiscard]] bool superseded() const { return superseded_.load(); }
  /// Bucket `k`'s gradients are final for this step (called from the script's backward).
  void ready(size_t k) {
    if (auto* s = sink_.load()) s->ready(k);
  }

  // ---- the state, as the script registered it last (either thread)
  void set_state(std::vector<held_tensor> tensors, std::string extras_json);
  /// The registered state as the runtime reads it: one region per tensor, replicated over a
  /// data-parallel group of `dp_size` in which this rank is `dp_index`.
  state_view view(int dp_size, int dp_index) const;

  // ---- the gradient buckets the script allocated (set once, before joining)
  void set_buckets(std::vector<gradient_bucket> buckets);
  /// The buckets, once the script made its Trainer (the job's first generation can form
  /// while the script still builds its model). Throws program_error when the script failed.
  const std::vector<gradient_bucket>& await_buckets();
  [[nodiscard]] const std::vector<gradient_bucket>& buckets() const { return buckets_; }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<ask> pending_;      // asked, not yet taken by next()
  bool taken_ = false;              // next() returned it; the answer is awaited
  std::optional<answer> answered_;  // the script's answer, for request()
  std::optional<ask> ended_;        // the session's end, once known
  std::string failed_;              // the script failed: why
  std::atomic<bool> superseded_{false};
  std::atomic<gradient_sink*> sink_{nullptr};
  std::vector<held_tensor> state_;
  std::string extras_json_;
  std::vector<gradient_bucket> buckets_;
  bool buckets_set_ = false;
};

}  // namespace troupe::python
