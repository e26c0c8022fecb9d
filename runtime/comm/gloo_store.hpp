#pragma once
// Adapts a kv_store to gloo's rendezvous::Store, so gloo's full-mesh connect can exchange its
// pair addresses through the coordinator's store, with every call bounded by one deadline.

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "runtime/comm/store.hpp"

namespace troupe::comm {

/// gloo::rendezvous::Store over a kv_store. gloo's get() has no timeout of its own, so every
/// call here waits at most until `deadline`; a missing key then throws store_error{timeout}.
/// Does not own `store`.
class gloo_store_adapter final : public gloo::rendezvous::Store {
 public:
  /// Called with every key and value gloo reads (the pair addresses of its peers among them).
  using value_observer = std::function<void(const std::string& key, const std::vector<char>&)>;

  gloo_store_adapter(kv_store& store, std::chrono::steady_clock::time_point deadline,
                     value_observer observe = {});

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::chrono::milliseconds remaining() const;

  kv_store& store_;
  std::chrono::steady_clock::time_point deadline_;
  value_observer observe_;
};

}  // namespace troupe::comm
