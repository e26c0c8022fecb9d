// A worker's in-memory checkpoint replica.

#include "actors/worker/checkpoint_replica.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <sstream>

#include "runtime/auth/credentials.hpp"

namespace troupe::actors {

namespace {

constexpr const char* token_key = "replica/token";

std::string rank_key(uint64_t generation, int rank) {
  return "replica/g" + std::to_string(generation) + "/r" + std::to_string(rank);
}

// Derived from the job's secret when this process holds it (every member computes the same
// token, and nothing secret crosses the store). Without credentials (tests in one process) the
// first worker to get here makes a token and the others read it from the store.
ckpt::replica_token job_token(comm::kv_store& store, std::chrono::milliseconds timeout) {
  if (const auto& creds = auth::process_credentials(); creds.valid()) {
    const auto key = auth::derive_key(creds, "checkpoint replica");
    ckpt::replica_token t{};
    std::memcpy(t.data(), key.data(), t.size());
    return t;
  }
  if (store.add("replica/token-maker", 1) == 1) {
    const ckpt::replica_token t = ckpt::random_replica_token();
    store.set(token_key, std::vector<char>(t.begin(), t.end()));
    return t;
  }
  const std::vector<char> v = store.get(token_key, timeout);
  ckpt::replica_token t{};
  if (v.size() != t.size()) throw std::runtime_error("replica: the job's token is malformed");
  std::memcpy(t.data(), v.data(), t.size());
  return t;
}

}  // namespace

checkpoint_replica::checkpoint_replica(comm::kv_store& store, const std::string& host,
                                       size_t max_chunk_bytes, std::chrono::milliseconds timeout)
    : token_(job_token(store, timeout)),
      server_(std::make_unique<ckpt::replica_server>(host, token_, max_chunk_bytes)),
      timeout_(std::min(timeout, std::chrono::milliseconds(2000))) {}

checkpoint_replica::~checkpoint_replica() = default;

void checkpoint_replica::enter_generation(comm::kv_store& store, uint64_t generation, int rank,
                                          int world, int node) {
  const std::string mine = std::to_string(node) + " " + server_->endpoint();
  store.set(rank_key(generation, rank), std::vector<char>(mine.begin(), mine.end()));
  std::vector<std::string> peers(static_cast<size_t>(world));
  std::vector<int> nodes(static_cast<size_t>(world), -1);
  for (int r = 0; r < world; ++r) {
    const std::vector<char> v = store.get(rank_key(generation, r), timeout_);
    std::istringstream in(std::string(v.begin(), v.end()));
    in >> nodes[static_cast<size_t>(r)] >> peers[static_cast<size_t>(r)];
  }
  std::string buddy;
  for (int step = 1; step < world && buddy.empty(); ++step) {
    const int r = (rank + step) % world;
    if (nodes[static_cast<size_t>(r)] != node) buddy = peers[static_cast<size_t>(r)];
  }
  if (buddy.empty() && world > 1) buddy = peers[static_cast<size_t>((rank + 1) % world)];
  std::lock_guard lock(mutex_);
  buddy_ = buddy;
  peers_ = std::move(peers);
}

ckpt::chunk_observer checkpoint_replica::observer() {
  return [this](int rank, int64_t step, const ckpt::chunk_key& key, std::span<const float> data) {
    std::string buddy;
    {
      std::lock_guard lock(mutex_);
      buddy = buddy_;
    }
    if (buddy.empty()) return;
    if (!writer_client_) writer_client_ = std::make_unique<ckpt::replica_client>(token_, timeout_);
    const std::span<const unsigned char> bytes(reinterpret_cast<const unsigned char*>(data.data()),
                                               data.size_bytes());
    if (writer_client_->put(buddy, rank, step, key, bytes)) {
      sent_ += bytes.size();
      return;
    }
    // A buddy that does not answer (lost, say) gets nothing more until the next generation,
    // so a write is never held up by it for more than one timeout.
    std::lock_guard lock(mutex_);
    if (buddy_ == buddy) buddy_.clear();
  };
}

uint64_t checkpoint_replica::take_sent_bytes() { return sent_.exchange(0); }

ckpt::memory_source checkpoint_replica::memory() {
  std::vector<std::string> others;  // the live ranks' servers but this process's own
  {
    std::lock_guard lock(mutex_);
    for (const std::string& p : peers_)
      if (p != server_->endpoint()) others.push_back(p);
  }
  if (!restore_client_) restore_client_ = std::make_unique<ckpt::replica_client>(token_, timeout_);
  // The chunks of the window the restore announced last that this process's own server does
  // not hold, fetched ahead with one request per live peer; the own server's are copied
  // straight into the restore's buffer when fetched (no round trip, no second copy).
  // restore_into announces every chunk with its window before it fetches it.
  auto ready = std::make_shared<std::map<ckpt::chunk_key, std::vector<float>>>();
  ckpt::memory_source source;
  source.prefetch = [this, others, ready](std::span<const ckpt::chunk_key> keys) {
    ready->clear();  // what the last window did not use is not wanted any more
    std::vector<ckpt::chunk_key> missing;  // this process's server copies at fetch time
    for (const ckpt::chunk_key& k : keys)
      if (!server_->holds(k)) missing.push_back(k);
    for (const std::string& p : others) {
      std::vector<ckpt::chunk_key> still;
      for (size_t at = 0; at < missing.size(); at += ckpt::max_batch_keys) {
        const auto batch =
            std::span(missing).subspan(at, std::min(ckpt::max_batch_keys, missing.size() - at));
        auto got = restore_client_->get_many(p, batch);
        if (!got) {  // refused or silent: not asked again in this window
          still.insert(still.end(), missing.begin() + static_cast<std::ptrdiff_t>(at),
                       missing.end());
          break;
        }
        for (size_t i = 0; i < batch.size(); ++i) {
          if (!(*got)[i].empty())
            ready->emplace(batch[i], std::move((*got)[i]));
          else
            still.push_back(batch[i]);
        }
      }
      missing = std::move(still);
      if (missing.empty()) break;
    }
  };
  source.fetch = [this, ready](const ckpt::chunk_key& key, std::vector<float>& out) {
    if (const auto it = ready->find(key); it != ready->end()) {
      out = std::move(it->second);
      ready->erase(it);
      return true;
    }
    // Not fetched with its window: this process's own server, or the disk.
    return server_->copy_out(key, out);
  };
  return source;
}

}  // namespace troupe::actors
