// Expert parallelism against the single-rank MoE model: ep = 2 and 4 ranks (threads), top_k 1
// and 2, with and without dropped tokens. Loss, routing counts and every rank's gradients
// (replicated tensors and its own experts, matched by name) must equal those of one rank
// that trains the concatenated micro-batch, step after step of plain SGD.

#include "strategies/expert_parallel/expert_parallel.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/store.hpp"

namespace troupe {
namespace {

using namespace std::chrono_literals;

// ---------------------------------------------------------------------------------------
// SHARED-MEMORY TEST DOUBLE, for this unit test only: ranks are threads of one process and
// each collective reads the other ranks' buffers between two barriers. No deadline, no
// abort while blocked; it tests the EP math apart from any transport. The gloo cases below
// run the same math over a real communicator.
// ---------------------------------------------------------------------------------------
struct shm_group {
  explicit shm_group(int n) : size(n), sync(n), in(n), send(n) {}
  int size;
  std::barrier<> sync;
  std::vector<const void*> in;                   // each rank's posted input
  std::vector<const std::vector<size_t>*> send;  // each rank's all_to_allv send sizes
};

class shm_communicator final : public comm::communicator {
 public:
  shm_communicator(shm_group& g, int rank) : g_(g), id_{0, "ep-shm", rank, g.size} {}
  const comm::comm_identity& identity() const override { return id_; }

  void all_reduce(float* data, size_t count, comm::reduce_op op, const comm::op_options&) override {
    post(data);
    std::vector<float> sum(count, 0.0f);
    for (int r = 0; r < g_.size; ++r) {  // rank order: every rank adds identically
      const auto* v = static_cast<const float*>(g_.in[r]);
      for (size_t i = 0; i < count; ++i) sum[i] += v[i];
    }
    g_.sync.arrive_and_wait();  // everyone has read every input
    const float div = op == comm::reduce_op::average ? static_cast<float>(g_.size) : 1.0f;
    for (size_t i = 0; i < count; ++i) data[i] = sum[i] / div;
  }
  void broadcast(void* data, size_t bytes, int root, const comm::op_options&) override {
    post(data);
    if (rank() != root && bytes > 0) std::memcpy(data, g_.in[root], bytes);
    g_.sync.arrive_and_wait();
  }
  void barrier(const comm::op_options&) override { g_.sync.arrive_and_wait(); }
  void all_to_all(const void* in, void* out, size_t bytes, const comm::op_options&) override {
    post(in);
    for (int j = 0; j < g_.size; ++j) {
      std::memcpy(static_cast<char*>(out) + j * bytes,
                  static_cast<const char*>(g_.in[j]) + rank() * bytes, bytes);
    }
    g_.sync.arrive_and_wait();
  }
  void all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes, const comm::op_options&) override {
    g_.send[rank()] = &send_bytes;
    post(in);
    size_t at = 0;
    for (int j = 0; j < g_.size; ++j) {
      const std::vector<size_t>& theirs = *g_.send[j];
      size_t offset = 0;
      for (int k = 0; k < rank(); ++k) offset += theirs[k];
      EXPECT_EQ(theirs[rank()], recv_bytes[j]) << "rank " << j << " -> " << rank();
      const size_t n = std::min(theirs[rank()], recv_bytes[j]);
      if (n > 0)
        std::memcpy(static_cast<char*>(out) + at, static_cast<const char*>(g_.in[j]) + offset, n);
      at += recv_bytes[j];
    }
    g_.sync.arrive_and_wait();
  }
  void reduce_scatter(const float* in, float* out, size_t count, comm::reduce_op op,
                      const comm::op_options&) override {
    post(in);
    const float div = op == comm::reduce_op::average ? static_cast<float>(g_.size) : 1.0f;
    for (size_t i = 0; i < count; ++i) {
      float sum = 0;
      for (int r = 0; r < g_.size; ++r)
        sum += static_cast<const float*>(g_.in[r])[rank() * count + i];
      out[i] = sum / div;
    }
    g_.sync.arrive_and_wait();
  }
  void all_gather(const void* in, void* out, size_t bytes, const comm::op_options&) override {
    post(in);
    for (int j = 0; j < g_.size; ++j) {
      if (bytes > 0) std::memcpy(static_cast<char*>(out) + j * bytes, g_.in[j], bytes);
    }
    g_.sync.arrive_and_wait();
  }
  // Point-to-point is not needed by expert parallelism.
  void send(const void*, size_t, int, uint32_t, const comm::op_options&) override {
    throw comm::comm_error(comm::comm_errc::invalid, "shm test double: no send");
  }
  void recv(void*, size_t, int, uint32_t, const comm::op_options&) override {
    throw comm::comm_error(comm::comm_errc::invalid, "shm test double: no recv");
  }
  void abort() override { aborted_ = true; }
  bool aborted() const override { return aborted_; }

 private:
  void post(const void* p) {
    g_.in[rank()] = p;
    g_.sync.arrive_and_wait();
  }
  shm_group& g_;
  comm::comm_identity id_;
  std::atomic<bool> aborted_{false};
};

enum class transport { shm, gloo };

/// Runs body(rank, communicator) on p threads over the chosen transport.
template <class Body>
void on_ranks(transport how, int p, Body body) {
  std::vector<std::future<void>> ranks;
  if (how == transport::shm) {
    shm_group group(p);
    for (int r = 0; r < p; ++r) {
      ranks.push_back(std::async(std::launch::async, [&, r] {
        shm_communicator c(group, r);
        body(r, static_cast<comm::communicator&>(c));
      }));
    }
    for (auto& f : ranks) f.get();
    return;
  }
  comm::tcp_store_server server;
  for (int r = 0; r < p; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto store = comm::connect_tcp_store("127.0.0.1", server.port(), 5s);
      auto c = comm::make_gloo_communicator(*store, {1, "ep", r, p});
      body(r, *c);
    }));
  }
  for (auto& f : ranks) f.get();
}

// ---------------------------------------------------------------------------------------

struct ep_case {
  transport how;
  int ep;
  int top_k;
  double capacity_factor;  // 0.5 drops choices; 2.5 drops none at these sizes
};

void PrintTo(const ep_case& c, std::ostream* os) {
  *os << "ep=" << c.ep << " top_k=" << c.top_k << " capacity_factor=" << c.capacity_factor;
}

std::string case_name(const ::testing::TestParamInfo<ep_case>& info) {
  const ep_case& c = info.param;
  return std::string(c.how == transport::shm ? "shm" : "gloo") + "_ep" + std::to_string(c.ep) +
         "_top" + std::to_string(c.top_k) + (c.capacity_factor < 1 ? "_drops" : "_no_drops");
}

constexpr int steps = 20;  // the integration criterion: 20 steps within 1e-4
constexpr int seqs_per_rank = 2;
constexpr int T = 8;
constexpr float lr = 0.2f;

model_config ep_model(const ep_case& c) {
  model_config m;
  m.n_layer = 2;
  m.n_head = 2;
  m.d_model = 16;
  m.context = T;
  m.experts = 8;
  m.top_k = c.top_k;
  m.capacity_factor = c.capacity_factor;
  m.aux_loss_coef = 0.1;
  return m;
}

/// Step s's global micro-batch: ep * seqs_per_rank sequences; rank r takes its slice.
void step_batch(int step, int n, std::vector<token_id>& in, std::vector<token_id>& tg) {
  in.resize(n);
  tg.resize(n);
  for (int i = 0; i < n; ++i) {
    in[i] = static_cast<token_id>((step * 29 + i * 37 + i * i) % 23 + 97);
    tg[i] = static_cast<token_id>((step * 13 + i * 53) % 19 + 97);
  }
}

/// One rank's (or the reference's) record of a step.
struct step_record {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;
  std::vector<std::vector<int64_t>> counts;  // per block
  int64_t dropped = 0;
};

void record(const gpt& m, double loss, step_record& out) {
  out.loss = loss;
  for (const param_tensor& t : m.param_table()) {
    out.grads[t.name].assign(m.grads() + t.offset, m.grads() + t.offset + t.numel);
  }
  for (int l = 0; l < m.config().n_layer; ++l) {
    out.counts.push_back(m.tokens_per_expert(l));
    out.dropped += m.moe_layer(l).dropped_tokens();
  }
}

void sgd(gpt& m) {
  for (size_t i = 0; i < m.num_params(); ++i) m.params()[i] -= lr * m.grads()[i];
}

class expert_parallel : public ::testing::TestWithParam<ep_case> {};

// Method: the reference is one gpt (float) trained on the concatenated micro-batch; the
// ep ranks each train their slice of it with the same seed, exchange through their
// communicator, reduce_expert_parallel_grads, and take the same SGD step. Every step:
// mean rank loss vs reference loss (1e-5 relative), routing counts and drops (exact),
// every tensor's gradient on every rank vs the reference's same-named tensor (1e-4
// relative L2 norm; exactly zero where the reference's is, e.g. an idle expert).
TEST_P(expert_parallel, matches_single_rank_model) {
  const ep_case c = GetParam();
  const model_config cfg = ep_model(c);
  const int p = c.ep;
  const int seed = 11;

  std::vector<step_record> ref(steps);
  {
    gpt m(cfg);
    m.init_params(seed);
    std::vector<token_id> in, tg;
    for (int s = 0; s < steps; ++s) {
      step_batch(s, p * seqs_per_rank * T, in, tg);
      m.zero_grads();
      record(m, m.forward_backward(in.data(), tg.data(), p * seqs_per_rank, T, 1.0f), ref[s]);
      sgd(m);
    }
  }
  if (c.capacity_factor < 1) {
    EXPECT_GT(ref[0].dropped, 0) << "the case must drop tokens";
  } else {
    EXPECT_EQ(ref[0].dropped, 0);
  }

  // Both transports implement all_to_all(v): any error a rank meets fails the test (f.get()
  // rethrows it here); nothing about this machine can make the case not apply.
  std::vector<std::vector<step_record>> got(p, std::vector<step_record>(steps));
  on_ranks(c.how, p, [&](int r, comm::communicator& comm) {
    const comm::op_options opts{20s};
    strategies::ep_exchange exchange(comm, opts);
    gpt m(cfg, &exchange);
    m.init_params(seed);
    std::vector<token_id> in, tg;
    const size_t slice = static_cast<size_t>(seqs_per_rank) * T;
    for (int s = 0; s < steps; ++s) {
      step_batch(s, p * seqs_per_rank * T, in, tg);
      m.zero_grads();
      const double loss =
          m.forward_backward(in.data() + r * slice, tg.data() + r * slice, seqs_per_rank, T, 1.0f);
      strategies::reduce_expert_parallel_grads(m, comm, opts);
      record(m, loss, got[r][s]);
      sgd(m);
    }
  });

  for (int s = 0; s < steps; ++s) {
    double mean = 0;
    for (int r = 0; r < p; ++r) mean += got[r][s].loss / p;
    EXPECT_NEAR(mean, ref[s].loss, 1e-5 * ref[s].loss) << "step " << s;
    for (int r = 0; r < p; ++r) {
      const step_record& g = got[r][s];
      EXPECT_EQ(g.counts, ref[s].counts) << "step " << s << " rank " << r;
      EXPECT_EQ(g.dropped, ref[s].dropped) << "step " << s << " rank " << r;
      for (const auto& [name, v] : g.grads) {
        const std::vector<float>& want = ref[s].grads.at(name);
        ASSERT_EQ(v.size(), want.size()) << name;
        double num = 0, den = 0;
        for (size_t i = 0; i < v.size(); ++i) {
          num += (double(v[i]) - want[i]) * (double(v[i]) - want[i]);
          den += double(want[i]) * want[i];
        }
        if (den == 0) {
          EXPECT_EQ(num, 0) << name << " step " << s << " rank " << r;
        } else {
          EXPECT_LT(std::sqrt(num / den), 1e-4) << name << " step " << s << " rank " << r;
        }
      }
    }
  }
  // The ranks' expert shards cover every expert of the reference exactly once.
  size_t expert_tensors = 0;
  for (int r = 0; r < p; ++r) {
    for (const auto& [name, v] : got[r][0].grads)
      expert_tensors += name.find(".moe.experts.") != std::string::npos;
  }
  EXPECT_EQ(expert_tensors, static_cast<size_t>(cfg.n_layer * cfg.experts * 4));
}

std::vector<ep_case> all_cases() {
  std::vector<ep_case> cases;
  for (transport how : {transport::shm, transport::gloo}) {
    for (int ep : {2, 4}) {
      for (int k : {1, 2}) {
        for (double cf : {2.5, 0.5}) cases.push_back({how, ep, k, cf});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(ep, expert_parallel, ::testing::ValuesIn(all_cases()), case_name);

TEST(expert_parallel_layout, experts_must_divide_over_the_group) {
  shm_group group(3);
  shm_communicator c(group, 0);
  strategies::ep_exchange exchange(c, {1s});
  model_config cfg = ep_model({transport::shm, 3, 1, 1.0});
  EXPECT_THROW(gpt(cfg, &exchange), std::invalid_argument);  // 8 experts over 3 ranks
}

}  // namespace
}  // namespace troupe
