// troupe_train_single: the reference training loop on one rank, for checking that the
// defaults learn and for measuring single-rank throughput against PyTorch
// (bench/run_train_bench.sh). Flags override the defaults of runtime/config.hpp.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "runtime/data/dataset.hpp"
#include "runtime/optim/adamw.hpp"
#include "runtime/trainer.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

struct options {
  troupe::train_config cfg;
  int print_every = 20;
  int measure_from = -1;  ///< throughput mode: time the steps from this one on
};

/// Prints "why flag value" and the usage, then exits with status 2.
[[noreturn]] void usage(const char* why, const std::string& flag = "",
                        const std::string& value = "") {
  std::fprintf(stderr,
               "troupe_train_single: %s %s %s\n"
               "usage: troupe_train_single [--data PATH] [--steps N] [--batch N]\n"
               "  [--micro-batch N] [--lr X] [--warmup N] [--layers N] [--heads N]\n"
               "  [--d-model N] [--context N] [--seed N] [--eval-every N]\n"
               "  [--eval-batches N] [--print-every N] [--blas-threads N]\n"
               "  [--throughput SKIP]  (time steps SKIP.. and print tokens/s; no eval)\n",
               why, flag.c_str(), value.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  troupe::train_config& c = o.cfg;
  c.data = TROUPE_DEFAULT_CORPUS_PATH;
  const std::map<std::string, int*> ints{{"--steps", &c.steps},
                                         {"--batch", &c.batch},
                                         {"--micro-batch", &c.micro_batch},
                                         {"--warmup", &c.optim.warmup_steps},
                                         {"--layers", &c.model.n_layer},
                                         {"--heads", &c.model.n_head},
                                         {"--d-model", &c.model.d_model},
                                         {"--context", &c.model.context},
                                         {"--eval-every", &c.eval_every},
                                         {"--eval-batches", &c.eval_batches},
                                         {"--print-every", &o.print_every},
                                         {"--blas-threads", &c.blas_threads},
                                         {"--throughput", &o.measure_from}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") usage("training options");
    if (i + 1 >= argc) usage("missing value after", flag);
    const std::string v = argv[++i];
    char* end = nullptr;
    if (flag == "--data") {
      c.data = v;
    } else if (flag == "--lr") {
      c.optim.lr = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0') usage("not a number:", flag, v);
    } else if (flag == "--seed") {
      c.seed = std::strtoull(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0') usage("not an integer:", flag, v);
    } else if (auto it = ints.find(flag); it != ints.end()) {
      const long x = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0') usage("not an integer:", flag, v);
      *it->second = static_cast<int>(x);
    } else {
      usage("unknown flag", flag);
    }
  }
  if (o.measure_from >= c.steps) usage("--throughput SKIP must be below --steps");
  return o;
}

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows up live in a log file too
  const options o = parse(argc, argv);
  const troupe::train_config& c = o.cfg;
  try {
    troupe::set_blas_threads(c.blas_threads);
    const troupe::token_dataset data =
        troupe::token_dataset::open(c.data, c.val_fraction, c.model.context, c.val_data);
    troupe::gpt model(c.model);
    model.init_params(c.seed);
    troupe::adamw opt(c.optim, model.param_table(), model.num_params());
    const bool bench = o.measure_from >= 0;
    std::printf("model: %d layers, %d heads, d_model %d, context %d, %zu parameters\n",
                c.model.n_layer, c.model.n_head, c.model.d_model, c.model.context,
                model.num_params());
    std::printf("data: %s (%zu train / %zu val bytes); %d steps of %d x %d tokens\n",
                c.data.c_str(), data.train_size(), data.val_size(), c.steps, c.batch,
                c.model.context);
    if (!bench) std::printf("step 0 val loss %.4f\n", troupe::evaluate(model, data, c));

    const auto start = clock_type::now();
    auto measured = start;
    std::clock_t measured_cpu = std::clock();
    double loss_window = 0;
    int window = 0;
    for (int step = 0; step < c.steps; ++step) {
      if (step == o.measure_from) {
        measured = clock_type::now();
        measured_cpu = std::clock();
      }
      const troupe::grad_result r = troupe::compute_gradients(model, data, c, step, 0, 1);
      const double norm = opt.clip_gradients(model.grads(), model.num_params());
      opt.step(model.params(), model.grads(), step, c.steps);
      loss_window += r.loss_sum / static_cast<double>(r.tokens);
      ++window;
      if (o.print_every > 0 && (step + 1) % o.print_every == 0) {
        std::printf("step %4d  loss %.4f  grad-norm %.3f  lr %.2e  %.1f s\n", step + 1,
                    loss_window / window, norm, opt.learning_rate(step, c.steps),
                    seconds_since(start));
        loss_window = 0;
        window = 0;
      }
      if (!bench && c.eval_every > 0 && (step + 1) % c.eval_every == 0 && step + 1 < c.steps) {
        std::printf("step %4d  val loss %.4f\n", step + 1, troupe::evaluate(model, data, c));
      }
    }
    const double total = seconds_since(start);
    if (bench) {
      const double timed = seconds_since(measured);
      const double cpu = static_cast<double>(std::clock() - measured_cpu) / CLOCKS_PER_SEC;
      const double tokens =
          static_cast<double>(c.steps - o.measure_from) * c.batch * c.model.context;
      // CPU time too: on a shared machine it is the steadier of the two.
      std::printf("tokens_per_s %.1f  (%d steps timed, %.3f s/step, %.0f tokens per CPU s)\n",
                  tokens / timed, c.steps - o.measure_from, timed / (c.steps - o.measure_from),
                  tokens / cpu);
    } else {
      std::printf("final val loss %.4f  after %d steps in %.1f s (%.0f tokens/s)\n",
                  troupe::evaluate(model, data, c), c.steps, total,
                  static_cast<double>(c.steps) * c.batch * c.model.context / total);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe_train_single: %s\n", e.what());
    return 1;
  }
  return 0;
}
