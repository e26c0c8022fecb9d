// nccl_communicator: NCCL in non-blocking mode, so that no call blocks inside NCCL; every op
// is enqueued, then polled (async error, stream, deadline, abort flag) until it finishes.
#include "runtime/comm/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace troupe::comm {
namespace {

using clock_type = std::chrono::steady_clock;

/// How often a waiting op looks at the stream, the async error and the abort flag. Short,
/// because the wait is the latency of every collective.
constexpr auto poll_interval = std::chrono::microseconds(20);

comm_errc classify(ncclResult_t r) {
  // Remote and system errors are what a dead or unreachable peer produces.
  return (r == ncclRemoteError || r == ncclSystemError) ? comm_errc::peer_lost
                                                        : comm_errc::internal;
}

class nccl_communicator final : public communicator {
 public:
  nccl_communicator(comm_identity id, int device, ncclComm_t comm, cudaStream_t stream,
                    float* scratch)
      : id_(std::move(id)), device_(device), comm_(comm), stream_(stream), scratch_(scratch) {}

  ~nccl_communicator() override {
    cudaSetDevice(device_);
    {
      std::lock_guard<std::mutex> lock(m_);
      if (!comm_gone_) {
        // A healthy communicator is finalized (flushing its work) before it is destroyed;
        // one that does not finish in time is aborted instead.
        const ncclResult_t f = ncclCommFinalize(comm_);
        bool clean = f == ncclSuccess || f == ncclInProgress;
        const auto deadline = clock_type::now() + std::chrono::seconds(10);
        ncclResult_t state = ncclInProgress;
        while (clean && state == ncclInProgress && clock_type::now() < deadline) {
          if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) clean = false;
          if (state == ncclInProgress) std::this_thread::sleep_for(poll_interval);
        }
        if (clean && state == ncclSuccess) {
          ncclCommDestroy(comm_);
        } else {
          ncclCommAbort(comm_);
        }
        comm_gone_ = true;
      }
    }
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }

  const comm_identity& identity() const override { return id_; }

  void all_reduce(float* data, size_t count, reduce_op op, const op_options& opts) override {
    run("all_reduce", opts, [&] {
      return ncclAllReduce(data, data, count, ncclFloat, op == reduce_op::sum ? ncclSum : ncclAvg,
                           comm_, stream_);
    });
  }

  void broadcast(void* data, size_t bytes, int root, const op_options& opts) override {
    if (root < 0 || root >= id_.size) {
      throw comm_error(comm_errc::invalid, "nccl broadcast: root " + std::to_string(root) +
                                               " is not a rank (" + context_string() + ")");
    }
    run("broadcast", opts,
        [&] { return ncclBroadcast(data, data, bytes, ncclChar, root, comm_, stream_); });
  }

  void barrier(const op_options& opts) override {
    run("barrier", opts,
        [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_); });
  }

  void reduce_scatter(const float* in, float* out, size_t count, reduce_op op,
                      const op_options& opts) override {
    run("reduce_scatter", opts, [&] {
      return ncclReduceScatter(in, out, count, ncclFloat, op == reduce_op::sum ? ncclSum : ncclAvg,
                               comm_, stream_);
    });
  }

  void all_gather(const void* in, void* out, size_t bytes, const op_options& opts) override {
    run("all_gather", opts,
        [&] { return ncclAllGather(in, out, bytes, ncclChar, comm_, stream_); });
  }

  void all_to_all(const void* in, void* out, size_t bytes_per_rank,
                  const op_options& opts) override {
    std::vector<size_t> even(static_cast<size_t>(id_.size), bytes_per_rank);
    all_to_allv(in, even, out, even, opts);
  }

  /// NCCL has no all-to-all; one group of sends and receives is its documented equivalent.
  void all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes, const op_options& opts) override {
    const auto p = static_cast<size_t>(id_.size);
    if (send_bytes.size() != p || recv_bytes.size() != p ||
        send_bytes[static_cast<size_t>(id_.rank)] != recv_bytes[static_cast<size_t>(id_.rank)]) {
      throw comm_error(comm_errc::invalid, "nccl all_to_allv: count vectors must have " +
                                               std::to_string(p) + " entries (" + context_string() +
                                               ")");
    }
    run("all_to_allv", opts, [&] {
      const auto* src = static_cast<const char*>(in);
      auto* dst = static_cast<char*>(out);
      // This rank's own block is a device copy on the same stream, ordered with the rest.
      size_t send_at = 0;
      size_t recv_at = 0;
      for (size_t j = 0; j < static_cast<size_t>(id_.rank); ++j) {
        send_at += send_bytes[j];
        recv_at += recv_bytes[j];
      }
      const size_t own = send_bytes[static_cast<size_t>(id_.rank)];
      if (own > 0 && cudaMemcpyAsync(dst + recv_at, src + send_at, own, cudaMemcpyDeviceToDevice,
                                     stream_) != cudaSuccess) {
        return ncclUnhandledCudaError;
      }
      ncclResult_t r = ncclGroupStart();
      for (size_t j = 0; j < p && (r == ncclSuccess || r == ncclInProgress); ++j) {
        if (j != static_cast<size_t>(id_.rank) && send_bytes[j] > 0) {
          r = ncclSend(src, send_bytes[j], ncclChar, static_cast<int>(j), comm_, stream_);
        }
        if ((r == ncclSuccess || r == ncclInProgress) && j != static_cast<size_t>(id_.rank) &&
            recv_bytes[j] > 0) {
          r = ncclRecv(dst, recv_bytes[j], ncclChar, static_cast<int>(j), comm_, stream_);
        }
        src += send_bytes[j];
        dst += recv_bytes[j];
      }
      const ncclResult_t end = ncclGroupEnd();
      return (r == ncclSuccess || r == ncclInProgress) ? end : r;
    });
  }

  // NCCL matches point-to-point operations per peer in call order and has no tags, so the tag
  // is only checked for range here; callers must issue matching pairs in the same order.
  void send(const void* data, size_t bytes, int peer, uint32_t, const op_options& opts) override {
    check_peer("send", peer);
    run("send", opts, [&] { return ncclSend(data, bytes, ncclChar, peer, comm_, stream_); });
  }

  void recv(void* data, size_t bytes, int peer, uint32_t, const op_options& opts) override {
    check_peer("recv", peer);
    run("recv", opts, [&] { return ncclRecv(data, bytes, ncclChar, peer, comm_, stream_); });
  }

  void send_recv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                 size_t recv_bytes, int recv_peer, uint32_t, const op_options& opts) override {
    check_peer("send_recv", send_peer);
    check_peer("send_recv", recv_peer);
    // One group: NCCL posts both halves before either waits, so neighbours cannot deadlock.
    run("send_recv", opts, [&] {
      ncclResult_t r = ncclGroupStart();
      if (r == ncclSuccess)
        r = ncclSend(send_data, send_bytes, ncclChar, send_peer, comm_, stream_);
      if (r == ncclSuccess)
        r = ncclRecv(recv_data, recv_bytes, ncclChar, recv_peer, comm_, stream_);
      const ncclResult_t end = ncclGroupEnd();
      return r == ncclSuccess ? end : r;
    });
  }

  void abort() override {
    aborted_.store(true);
    std::lock_guard<std::mutex> lock(m_);
    // An op in flight sees the flag within one poll interval and aborts from its own thread.
    if (!in_flight_) abort_locked();
  }

  bool aborted() const override { return aborted_.load(); }

 private:
  std::string context_string() const {
    return "group " + id_.group + ", generation " + std::to_string(id_.generation) + ", rank " +
           std::to_string(id_.rank) + " of " + std::to_string(id_.size) + ", device " +
           std::to_string(device_);
  }

  void check_peer(const char* name, int peer) const {
    if (peer < 0 || peer >= id_.size || peer == id_.rank) {
      throw comm_error(comm_errc::invalid, std::string("nccl ") + name + ": peer " +
                                               std::to_string(peer) + " is not another rank (" +
                                               context_string() + ")");
    }
  }

  void abort_locked() {
    if (comm_gone_) return;
    ncclCommAbort(comm_);
    comm_gone_ = true;
  }

  /// Marks the communicator dead, aborts it (so peers blocked on us fail too) and throws.
  [[noreturn]] void fail(const char* name, comm_errc code, const std::string& detail) {
    comm_error e(code, std::string("nccl ") + name + " " + to_string(code) + ": " + detail + " (" +
                           context_string() + ")");
    std::lock_guard<std::mutex> lock(m_);
    in_flight_ = false;
    if (!dead_) dead_.emplace(e);
    abort_locked();
    throw e;
  }

  template <class Enqueue>
  void run(const char* name, const op_options& opts, Enqueue&& enqueue) {
    if (opts.timeout.count() <= 0) {
      throw comm_error(
          comm_errc::invalid,
          std::string("nccl ") + name + ": timeout must be positive (" + context_string() + ")");
    }
    const auto deadline = clock_type::now() + opts.timeout;
    {
      std::lock_guard<std::mutex> lock(m_);
      if (!dead_ && aborted_) {
        dead_.emplace(comm_errc::aborted, "abort() was called (" + context_string() + ")");
      }
      if (dead_) {
        throw comm_error(dead_->code(),
                         std::string("nccl ") + name +
                             ": communicator is dead after an earlier failure: " + dead_->what());
      }
      in_flight_ = true;
    }
    if (const auto e = cudaSetDevice(device_); e != cudaSuccess) {
      fail(name, comm_errc::internal, std::string("cudaSetDevice: ") + cudaGetErrorString(e));
    }
    const ncclResult_t queued = enqueue();
    if (queued != ncclSuccess && queued != ncclInProgress) {
      fail(name, classify(queued), std::string("enqueue: ") + ncclGetErrorString(queued));
    }
    for (;;) {
      if (aborted_) fail(name, comm_errc::aborted, "aborted");
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess ||
          (state != ncclSuccess && state != ncclInProgress)) {
        fail(name, classify(state), std::string("async error: ") + ncclGetErrorString(state));
      }
      if (state == ncclSuccess) {  // enqueued; now wait for the stream
        const auto q = cudaStreamQuery(stream_);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) {
          fail(name, comm_errc::internal, std::string("stream: ") + cudaGetErrorString(q));
        }
      }
      if (clock_type::now() >= deadline) {
        fail(name, comm_errc::timeout,
             "not finished within " + std::to_string(opts.timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(poll_interval);
    }
    std::lock_guard<std::mutex> lock(m_);
    in_flight_ = false;
  }

  comm_identity id_;
  int device_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  float* scratch_;  ///< one device float for the barrier

  std::atomic<bool> aborted_{false};
  std::mutex m_;
  bool in_flight_ = false;          ///< guarded by m_
  bool comm_gone_ = false;          ///< aborted or destroyed; guarded by m_
  std::optional<comm_error> dead_;  ///< the first failure; guarded by m_
};

}  // namespace

std::unique_ptr<communicator> make_nccl_communicator(kv_store& store, const comm_identity& id,
                                                     int device, const nccl_options& opts) {
  const std::string where = "nccl connect (group " + id.group + ", generation " +
                            std::to_string(id.generation) + ", rank " + std::to_string(id.rank) +
                            " of " + std::to_string(id.size) + ", device " +
                            std::to_string(device) + ")";
  if (id.size < 1 || id.rank < 0 || id.rank >= id.size || id.group.empty() ||
      opts.connect_timeout.count() <= 0) {
    throw comm_error(comm_errc::invalid, where + ": invalid identity or options");
  }
  auto cuda_check = [&](cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
      throw comm_error(comm_errc::internal, where + ": " + what + ": " + cudaGetErrorString(e));
    }
  };
  const auto deadline = clock_type::now() + opts.connect_timeout;
  cuda_check(cudaSetDevice(device), "cudaSetDevice");

  // The unique id travels through the store, namespaced like every other key of this group.
  prefix_store scoped(store, "g" + std::to_string(id.generation) + "/" + id.group);
  ncclUniqueId uid{};
  try {
    if (id.rank == 0) {
      if (const auto r = ncclGetUniqueId(&uid); r != ncclSuccess) {
        throw comm_error(comm_errc::internal,
                         where + ": ncclGetUniqueId: " + ncclGetErrorString(r));
      }
      scoped.set("nccl_unique_id", std::vector<char>(uid.internal, uid.internal + sizeof(uid)));
    } else {
      const auto bytes = scoped.get("nccl_unique_id", opts.connect_timeout);
      if (bytes.size() != sizeof(uid)) {
        throw comm_error(comm_errc::internal, where + ": malformed nccl_unique_id in the store");
      }
      std::memcpy(uid.internal, bytes.data(), sizeof(uid));
    }
  } catch (const store_error& e) {
    throw as_connect_error(e, where);
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that init and collectives can be abandoned by ncclCommAbort
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, id.size, uid, id.rank, &config);
  while (r == ncclInProgress || r == ncclSuccess) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) state = ncclInternalError;
    if (state != ncclInProgress) {
      r = state;
      break;
    }
    if (clock_type::now() >= deadline) {
      ncclCommAbort(comm);
      throw comm_error(comm_errc::timeout, where + ": ncclCommInitRank did not finish within " +
                                               std::to_string(opts.connect_timeout.count()) +
                                               " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (r != ncclSuccess) {
    if (comm != nullptr) ncclCommAbort(comm);
    throw comm_error(classify(r), where + ": ncclCommInitRank: " + ncclGetErrorString(r));
  }

  cudaStream_t stream = nullptr;
  float* scratch = nullptr;
  try {
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&scratch), sizeof(float)), "cudaMalloc");
    cuda_check(cudaMemset(scratch, 0, sizeof(float)), "cudaMemset");
  } catch (...) {
    ncclCommAbort(comm);
    if (scratch != nullptr) cudaFree(scratch);
    if (stream != nullptr) cudaStreamDestroy(stream);
    throw;
  }
  return std::make_unique<nccl_communicator>(id, device, comm, stream, scratch);
}

}  // namespace troupe::comm
