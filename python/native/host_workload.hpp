#pragma once
// Inside a Python worker process: the workload the runtime drives when the user's script trains.
// Every call that needs the script (a step's forward and backward, the optimizer, a restore)
// becomes an ask on the host_link, answered by the script's thread; the gradients are the
// script's bucket memory, all-reduced in place by the runtime's bucket_reducer while backward
// still runs.

#include <memory>

#include "python/native/host_link.hpp"
#include "runtime/workload/workload.hpp"

namespace troupe::python {

/// `name`: what logs and events call it ("python3 train.py").
std::unique_ptr<workload> make_host_workload(std::shared_ptr<host_link> link, std::string name);

}  // namespace troupe::python
