#pragma once
// Small measuring tools of the control-plane bench: percentiles, loopback traffic, file sizes.

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::bench::control_plane {

/// The q-quantile (0..1) of `values` by the nearest-rank method; 0 for none.
double percentile(std::vector<double> values, double q);

/// Bytes received on the loopback interface so far (/proc/net/dev): every control message of
/// the simulation crosses it once, TLS records and CAF's framing included.
int64_t loopback_bytes();

/// Size of a file, 0 if absent.
int64_t file_bytes(const std::string& path);
/// Lines of a file, 0 if absent.
int64_t file_lines(const std::string& path);

/// CPU seconds this process has used (all threads).
double own_cpu_seconds();

}  // namespace troupe::bench::control_plane
