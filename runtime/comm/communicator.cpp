// Names of the data plane's error codes, for messages and logs.
#include "runtime/comm/communicator.hpp"

namespace troupe::comm {

double sum_in_rank_order(communicator& c, double value, const op_options& opts) {
  if (c.size() == 1) return value;
  std::vector<double> all(static_cast<size_t>(c.size()));
  c.all_gather(&value, all.data(), sizeof(double), opts);
  double total = 0;
  for (double v : all) total += v;
  return total;
}

void communicator::send_recv(const void*, size_t, int, void*, size_t, int, uint32_t, const op_options&) {
  throw comm_error(comm_errc::invalid, "send_recv: not supported by this backend (group '" + identity().group +
                                           "', rank " + std::to_string(rank()) + ")");
}

const char* to_string(comm_errc code) {
  switch (code) {
    case comm_errc::timeout:
      return "timeout";
    case comm_errc::peer_lost:
      return "peer_lost";
    case comm_errc::aborted:
      return "aborted";
    case comm_errc::invalid:
      return "invalid";
    case comm_errc::internal:
      return "internal";
  }
  return "unknown";
}

}  // namespace troupe::comm
