#pragma once
// `troupe bench control-plane`: its command line (bench/control_plane/ runs it).

#include <string>
#include <vector>

namespace troupe::cli {

/// Parses the options after `bench control-plane` and runs the benchmark; returns the exit
/// status (2 for options it refuses).
int run_control_plane_bench(const std::vector<std::string>& args);

}  // namespace troupe::cli
