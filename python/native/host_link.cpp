#include "python/native/host_link.hpp"

#include <utility>

namespace troupe::python {

answer host_link::request(ask a) {
  std::unique_lock lock(mu_);
  if (!failed_.empty()) throw program_error(failed_);
  pending_ = std::move(a);
  taken_ = false;
  answered_.reset();
  cv_.notify_all();
  cv_.wait(lock, [&] { return answered_.has_value() || !failed_.empty(); });
  if (!answered_) throw program_error(failed_);
  answer got = std::move(*answered_);
  answered_.reset();
  if (!got.error.empty()) throw workload_error(got.error);
  return got;
}

void host_link::end(int exit_code, std::string why, bool finished) {
  std::lock_guard lock(mu_);
  ask a;
  a.kind = ask_kind::ended;
  a.exit_code = exit_code;
  a.why = std::move(why);
  a.finished = finished;
  ended_ = std::move(a);
  cv_.notify_all();
}

ask host_link::next() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return (pending_.has_value() && !taken_) || ended_.has_value(); });
  if (pending_ && !taken_) {
    taken_ = true;
    return *pending_;
  }
  return *ended_;
}

void host_link::reply(answer a) {
  std::lock_guard lock(mu_);
  if (!pending_ || !taken_) return;  // nothing asked (a reply after the end): dropped
  pending_.reset();
  taken_ = false;
  answered_ = std::move(a);
  cv_.notify_all();
}

void host_link::fail(std::string why) {
  std::lock_guard lock(mu_);
  if (failed_.empty()) failed_ = why.empty() ? "the script failed" : std::move(why);
  cv_.notify_all();
}

void host_link::set_buckets(std::vector<gradient_bucket> buckets) {
  std::lock_guard lock(mu_);
  buckets_ = std::move(buckets);
  buckets_set_ = true;
  cv_.notify_all();
}

const std::vector<gradient_bucket>& host_link::await_buckets() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return buckets_set_ || !failed_.empty(); });
  if (!buckets_set_) throw program_error(failed_);
  return buckets_;
}

void host_link::set_state(std::vector<held_tensor> tensors, std::string extras_json) {
  std::lock_guard lock(mu_);
  state_ = std::move(tensors);
  extras_json_ = std::move(extras_json);
}

state_view host_link::view(int dp_size, int dp_index) const {
  std::lock_guard lock(mu_);
  state_view v;
  v.extras_json = extras_json_;
  for (const held_tensor& t : state_) {
    v.tensors.push_back(t.decl);
    v.regions.push_back(
        replicated_region(t.decl, std::span<std::byte>(t.data, t.decl.bytes()), dp_size, dp_index));
  }
  return v;
}

}  // namespace troupe::python
