#pragma once
// One rank's peak FLOP/s, measured: the denominator of the MFU estimate when the user gives
// none (--peak-flops).

#include <chrono>

namespace troupe {

/// FLOP/s of a square single-precision matrix product with `threads` BLAS threads, the best of
/// repeated runs within `budget` (a first, untimed run touches the buffers). What one rank's
/// compute could reach at best on this machine; memory-bound layers reach less.
double measure_peak_flops(int threads,
                          std::chrono::milliseconds budget = std::chrono::milliseconds(60));

}  // namespace troupe
