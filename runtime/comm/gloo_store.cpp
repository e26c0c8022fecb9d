// gloo_store_adapter: forwards gloo's rendezvous calls to a kv_store under one deadline.
#include "runtime/comm/gloo_store.hpp"

#include <algorithm>
#include <utility>

namespace troupe::comm {

gloo_store_adapter::gloo_store_adapter(kv_store& store,
                                       std::chrono::steady_clock::time_point deadline,
                                       value_observer observe)
    : store_(store), deadline_(deadline), observe_(std::move(observe)) {}

std::chrono::milliseconds gloo_store_adapter::remaining() const {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline_ - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

void gloo_store_adapter::set(const std::string& key, const std::vector<char>& data) {
  store_.set(key, data);
}

std::vector<char> gloo_store_adapter::get(const std::string& key) {
  auto value = store_.get(key, remaining());
  if (observe_) observe_(key, value);
  return value;
}

void gloo_store_adapter::wait(const std::vector<std::string>& keys) {
  store_.wait(keys, remaining());
}

void gloo_store_adapter::wait(const std::vector<std::string>& keys,
                              const std::chrono::milliseconds&) {
  // gloo passes its context timeout, which troupe sets to a fifth of the connect deadline
  // (gloo waits five of them for a pair); a peer's address may take the whole deadline.
  store_.wait(keys, remaining());
}

}  // namespace troupe::comm
