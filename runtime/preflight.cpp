#include "runtime/preflight.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/comm/tree_sum.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe {
namespace {

std::string gib(double bytes) {
  char buf[48];
  const double g = bytes / (1024.0 * 1024.0 * 1024.0);
  std::snprintf(buf, sizeof buf, g < 1e6 ? "%.2f GiB" : "%.3g GiB", g);
  return buf;
}

// A value of /proc/meminfo in bytes ("MemAvailable:   123456 kB"); 0 when absent.
uint64_t meminfo_bytes(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str() + key.size() + 1, "%llu", &kib) == 1) return kib * 1024ULL;
  }
  return 0;
}

// A path as a message quotes it: cut short, so a 5,000-byte path cannot flood the console.
std::string shown_path(const std::string& path) {
  return path.size() > 80 ? "'" + path.substr(0, 76) + "...'" : "'" + path + "'";
}

// check_path_length, with `headroom` bytes of PATH_MAX kept for what is written below the path
// (`below` says what) and `suffix` bytes of NAME_MAX in its last component (`suffixed` says why).
void check_length(const std::string& path, const std::string& key, const std::string& flag,
                  size_t headroom, const std::string& below, size_t suffix,
                  const std::string& suffixed) {
  const std::string named = key + " (" + flag + ")";
  const size_t path_max = PATH_MAX - 1 - headroom;  // PATH_MAX counts the terminating NUL
  if (path.size() > path_max)
    throw config_error(
        "config: " + named + " is " + std::to_string(path.size()) + " bytes long" +
        (headroom > 0 ? " as an absolute path" : "") + " (" + shown_path(path) +
        "); the limit is " + std::to_string(path_max) + " bytes: PATH_MAX " +
        std::to_string(PATH_MAX) + " less the terminating NUL" +
        (headroom > 0 ? " and " + std::to_string(headroom) + " bytes kept for " + below : "") +
        "; give a shorter " + flag);
  size_t start = 0;
  while (start < path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const bool last = path.find_first_not_of('/', end) == std::string::npos;
    const size_t name_max = NAME_MAX - (last ? suffix : 0);
    if (end - start > name_max)
      throw config_error(
          "config: " + named + " has a component of " + std::to_string(end - start) + " bytes (" +
          shown_path(path.substr(start, end - start)) + "); the limit is " +
          std::to_string(name_max) + " bytes: NAME_MAX " + std::to_string(NAME_MAX) +
          (last && suffix > 0 ? " less " + std::to_string(suffix) + " for " + suffixed : "") +
          "; give a shorter " + flag);
    start = end + 1;
  }
}

}  // namespace

void check_path_length(const std::string& path, const std::string& key, const std::string& flag) {
  check_length(path, key, flag, 0, "", 0, "");
}

void check_run_dir_length(const std::string& absolute_run_dir) {
  check_length(absolute_run_dir, "run_dir", "--run-dir", run_dir_headroom,
               "the files troupe writes below it (such as "
               "checkpoints/chunks/ab/<32 hex digits>.tmp.<pid>.<n>)",
               run_paths::archive_suffix_bytes,
               "the '.prev-<seconds>' suffix an earlier run is moved to");
}

long descriptors_needed(const train_config& cfg, process_role role) {
  // Ranks a process may have as peers: the world grows up to max_ranks; spares wait beside it.
  const long ranks = std::max(cfg.world, cfg.elastic.max_ranks) + cfg.elastic.spares;
  // Measured with `ls /proc/<pid>/fd | wc -l` at the peak of small jobs (worlds 1 to 8, 1 to 4
  // nodes, tp/pp/ZeRO-1, replicated checkpoints, a checkpoint every step): a coordinator held
  // 17 + about 2 per rank, an agent 7 whatever its workers, a worker 13 + 1 per peer, and up to
  // 11 + 6 per peer with tp x ZeRO-1 and replicated checkpoints (world 4: 35). The counts below
  // are about twice those, with room for a reconfiguration's old and new communicators and a
  // checkpoint's files open at once.
  switch (role) {
    case process_role::worker:
      return 32 + 8 * ranks;
    case process_role::agent:
      return 16 + 4 * ranks;
    case process_role::coordinator: {
      // Per rank its control-plane and store connections, per node its agent's; a few
      // scrapes of the metrics endpoint at once (a flood past them is refused).
      const long used = 32 + 4 * ranks + 4L * cfg.elastic.nodes + (cfg.metrics_port != 0 ? 16 : 0);
      // Listeners keep min(256, limit / 4) free (sys::descriptor_reserve()), so the limit must
      // hold that reserve above what is used.
      return used <= 768 ? (used * 4 + 2) / 3 : used + 256;
    }
  }
  return 0;
}

void check_descriptor_limit(long needed, long soft, long hard, const std::string& who) {
  if (soft >= needed) return;
  const std::string n = std::to_string(needed);
  throw config_error(
      "open files: " + who + " needs up to " + n +
      " open descriptors per process (sockets, shared memory, checkpoint files), but the limit "
      "on open files (RLIMIT_NOFILE) is " +
      std::to_string(soft) +
      (hard > soft ? " and could not be raised to the hard limit " + std::to_string(hard)
                   : ", the hard limit, which only root can raise") +
      "; run `ulimit -n " + n + "` (or more) in the shell that starts troupe" +
      (hard < needed ? ", as root or after raising nofile in /etc/security/limits.conf" : "") +
      ", then start it again");
}

double estimate_rank_bytes(const train_config& cfg) {
  const auto& m = cfg.model;
  const auto& p = cfg.parallel;
  const double C = m.d_model, T = m.context, V = m.vocab, L = m.n_layer, NH = m.n_head;
  const double E = m.experts;
  const double tp = std::max(p.tp, 1), pp = std::max(p.pp, 1), ep = std::max(p.ep, 1);
  // Parameters (runtime/model/gpt.hpp): embeddings, per block two LayerNorms, QKV and the
  // attention projection, then a dense MLP or a router and E experts; the final LayerNorm.
  const double mlp = 8 * C * C + 5 * C;
  const double shared = V * C + T * C + L * (4 * C * C + 8 * C) + 2 * C + (E > 0 ? 0 : L * mlp);
  const double experts = E > 0 ? L * (E * C + (E / ep) * mlp) : 0;
  const double params = shared / (tp * pp) + experts / pp;
  // ZeRO-1 shards AdamW's two moments over the data-parallel replicas.
  const double dp = std::max(1.0, std::floor(cfg.world / (tp * pp)));
  double state = params * (4 + 4 + 8 / (p.zero == 1 ? dp : 1.0));
  // The exact reduction (--reduction exact, or auto without experts or a program of your own)
  // keeps micro-batches' gradients apart: the fullest replica's extra copies.
  const bool exact = p.reduction == "exact" ||
                     (p.reduction == "auto" && !cfg.external_workload() && E == 0 && ep == 1);
  const int M =
      p.micro_batches > 0 ? p.micro_batches : std::max(1, cfg.batch / std::max(1, cfg.micro_batch));
  if (exact) {
    const int per_replica = (M + static_cast<int>(dp) - 1) / static_cast<int>(dp);
    int copies = 0;
    for (int first = 0; first < M; first += per_replica)
      copies =
          std::max(copies, comm::exact_sum_buffers(M, first, std::min(per_replica, M - first)));
    state += params * 4 * copies;
  }
  // Activations of one micro-batch, saved for the backward pass, and as much again for their
  // gradients: per token and block about 16 C values plus the attention scores, per token
  // the logits and their softmax, and with MoE top_k expert MLPs' hidden values.
  // --micro-batches M sets the training micro-batch to batch / M (a pipeline's pass, or a
  // replica's share); otherwise it is micro_batch. The larger of the two is the safe bound.
  const double train_micro =
      p.micro_batches > 0 ? std::ceil(static_cast<double>(cfg.batch) / p.micro_batches) : 0.0;
  const double tokens = std::max(static_cast<double>(cfg.micro_batch), train_micro) * T;
  const double per_block = (16 * C + 2 * NH * T) / tp + (E > 0 ? m.top_k * 8 * C : 0);
  const double acts = tokens * ((L / pp) * per_block + 2 * V) * 4;
  return state + 2 * acts;
}

void check_against_host(const train_config& cfg, int local_ranks, const host_facts& facts) {
  if (facts.memory_bytes > 0 && local_ranks > 0) {
    const double per_rank = estimate_rank_bytes(cfg);
    const double needs = per_rank * local_ranks;
    if (needs > static_cast<double>(facts.memory_bytes))
      throw config_error(
          "config: the job needs at least " + gib(needs) + " of memory (" +
          std::to_string(local_ranks) + " ranks x " + gib(per_rank) +
          ": parameters, gradients, AdamW state and activations of --layers " +
          std::to_string(cfg.model.n_layer) + " --d-model " + std::to_string(cfg.model.d_model) +
          " --context " + std::to_string(cfg.model.context) + " --experts " +
          std::to_string(cfg.model.experts) + " --micro-batch " + std::to_string(cfg.micro_batch) +
          "), this machine has " + gib(static_cast<double>(facts.memory_bytes)) + " (" +
          facts.memory_source +
          "); use a smaller model, --micro-batch, --world or more --tp/--pp/--ep/--zero");
  }
  if (facts.data_tokens < 0) return;
  const std::string corpus = "data (--data): corpus '" + cfg.data + "'";
  if (facts.data_tokens == 0)
    throw config_error(corpus + " is empty (0 tokens); give a non-empty file");
  // The same split as token_dataset: without a validation file, the last
  // floor(tokens * val_fraction) tokens are held out.
  const auto size = static_cast<uint64_t>(facts.data_tokens);
  const bool own_val = facts.val_tokens >= 0;
  const uint64_t val =
      own_val ? static_cast<uint64_t>(facts.val_tokens)
              : static_cast<uint64_t>(std::floor(static_cast<double>(size) * cfg.val_fraction));
  const uint64_t train = own_val ? size : size - val;
  const uint64_t window = static_cast<uint64_t>(cfg.model.context) + 1;
  // Distinct windows of context + 1 tokens a split holds: a batch's sequences and the
  // validation estimate's are drawn from them.
  const auto windows = [&](uint64_t tokens) { return tokens >= window ? tokens - window + 1 : 0; };
  const std::string sizes =
      own_val ? " has " + std::to_string(size) + " tokens (its training split) and --val-data '" +
                    cfg.val_data + "' " + std::to_string(val)
              : " has " + std::to_string(size) + " tokens: its training split " +
                    std::to_string(train) + " and its validation split (val_fraction " +
                    std::to_string(cfg.val_fraction).substr(0, 6) + ") " + std::to_string(val) +
                    " tokens";
  if (windows(train) < static_cast<uint64_t>(cfg.batch))
    throw config_error(corpus + sizes + "; the training split holds " +
                       std::to_string(windows(train)) +
                       " windows of context + 1 = " + std::to_string(window) +
                       " tokens, fewer than the " + std::to_string(cfg.batch) +
                       " sequences of one batch (--batch); use a larger file or a smaller "
                       "--context or --batch");
  const uint64_t eval_sequences =
      static_cast<uint64_t>(cfg.eval_batches) * static_cast<uint64_t>(cfg.micro_batch);
  if (windows(val) < 1 || windows(val) < eval_sequences)
    throw config_error(
        corpus + sizes + "; the validation split holds " + std::to_string(windows(val)) +
        " windows of context + 1 = " + std::to_string(window) + " tokens, fewer than the " +
        std::to_string(eval_sequences) + " the validation estimate reads (eval_batches " +
        std::to_string(cfg.eval_batches) + " x micro_batch " + std::to_string(cfg.micro_batch) +
        "); use a larger file or val_fraction, a smaller --context, or fewer "
        "eval_batches (--set eval_batches=N)");
}

host_facts read_host_facts(const train_config& cfg) {
  namespace fs = std::filesystem;
  host_facts facts;
  {
    std::ifstream in("/proc/meminfo");
    std::stringstream text;
    text << in.rdbuf();
    if (uint64_t avail = meminfo_bytes(text.str(), "MemAvailable")) {
      facts.memory_bytes = avail;
      facts.memory_source = "MemAvailable in /proc/meminfo";
    } else if (uint64_t total = meminfo_bytes(text.str(), "MemTotal")) {
      facts.memory_bytes = total;
      facts.memory_source = "MemTotal in /proc/meminfo";
    }
    std::ifstream cg("/sys/fs/cgroup/memory.max");
    unsigned long long limit = 0;
    if (cg >> limit && limit > 0 && (facts.memory_bytes == 0 || limit < facts.memory_bytes)) {
      facts.memory_bytes = limit;
      facts.memory_source = "the cgroup limit in /sys/fs/cgroup/memory.max";
    }
  }
  const std::string corpus = "data (--data): corpus '" + cfg.data + "'";
  if (cfg.data.empty())
    throw config_error(
        "data (--data): no corpus given and no default corpus was built; run scripts/setup.sh "
        "or pass --data FILE");
  // Workers open it by its absolute path (coordinator/job_run_dir.cpp).
  check_path_length(fs::absolute(cfg.data).string(), "data", "--data");
  std::error_code ec;
  const auto status = fs::status(cfg.data, ec);
  if (!fs::exists(status))
    throw config_error(
        corpus +
        " not found; run scripts/setup.sh (it builds the default corpus) or pass --data FILE");
  if (fs::is_directory(status))
    throw config_error(corpus + " is a directory; --data must name a text file or a token file");
  if (!fs::is_regular_file(status))
    throw config_error(corpus +
                       " is not a regular file; --data must name a text file or a token file");
  const int fd = ::open(cfg.data.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw config_error(corpus + " cannot be read (" + std::strerror(errno) +
                       "); check its permissions");
  ::close(fd);
  try {
    facts.data_tokens = static_cast<int64_t>(describe_corpus(cfg.data).tokens);
    if (!cfg.val_data.empty())
      facts.val_tokens = static_cast<int64_t>(describe_corpus(cfg.val_data).tokens);
  } catch (const data_error& e) {
    throw config_error(std::string("data (--data, --val-data): ") + e.what());
  }
  return facts;
}

}  // namespace troupe
