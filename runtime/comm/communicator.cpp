// Names of the data plane's error codes, for messages and logs.
#include "runtime/comm/communicator.hpp"

#include "runtime/comm/collective_math.hpp"

namespace troupe::comm {

std::string all_to_allv_argument_error(int rank, int size, const void* in,
                                       const std::vector<size_t>& send_bytes, const void* out,
                                       const std::vector<size_t>& recv_bytes) {
  const auto p = static_cast<size_t>(size);
  const auto r = static_cast<size_t>(rank);
  if (send_bytes.size() != p || recv_bytes.size() != p) {
    return "send_bytes and recv_bytes must have " + std::to_string(p) + " entries, not " +
           std::to_string(send_bytes.size()) + " and " + std::to_string(recv_bytes.size());
  }
  if (send_bytes[r] != recv_bytes[r]) {
    return "this rank sends itself " + std::to_string(send_bytes[r]) + " bytes but expects " +
           std::to_string(recv_bytes[r]);
  }
  size_t in_total = 0;
  size_t out_total = 0;
  for (size_t j = 0; j < p; ++j) {
    in_total += send_bytes[j];
    out_total += recv_bytes[j];
  }
  if ((in_total > 0 && in == nullptr) || (out_total > 0 && out == nullptr))
    return "null buffer with a non-zero size";
  if (in == out && in_total > 0 && p > 1) return "in and out must not be the same buffer";
  return {};
}

double sum_in_rank_order(communicator& c, double value, const op_options& opts) {
  if (c.size() == 1) return value;
  std::vector<double> all(static_cast<size_t>(c.size()));
  c.all_gather(&value, all.data(), sizeof(double), opts);
  double total = 0;
  for (double v : all) total += v;
  return total;
}

void communicator::send_recv(const void*, size_t, int, void*, size_t, int, uint32_t,
                             const op_options&) {
  throw comm_error(comm_errc::invalid, "send_recv: not supported by this backend (group '" +
                                           identity().group + "', rank " + std::to_string(rank()) +
                                           ")");
}

std::unique_ptr<communicator> communicator::shrink(const comm_identity&, const std::vector<int>&) {
  return nullptr;
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
