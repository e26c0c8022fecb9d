// `troupe ckpt inspect`, `diff` and `hash`: what a checkpoint holds, how two differ, and a
// digest of its training state.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <tuple>

#include "checkpoint/format.hpp"
#include "checkpoint/hash.hpp"
#include "cli/ckpt_common.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::cli::ckpt_tool {

using ckpt::chunk_key;
using ckpt::manifest;

namespace {

/// "0-3", "0,2,5", "0-1,4".
std::string ranks_text(const std::set<int>& ranks) {
  std::string out;
  for (auto it = ranks.begin(); it != ranks.end();) {
    int first = *it, last = *it;
    for (++it; it != ranks.end() && *it == last + 1; ++it) last = *it;
    out += (out.empty() ? "" : ",") + std::to_string(first);
    if (last != first) out += (last == first + 1 ? "," : "-") + std::to_string(last);
  }
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "scalar";
  std::string out;
  for (int64_t d : shape) out += (out.empty() ? "" : "x") + std::to_string(d);
  return out;
}

size_t numel_of(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

/// Each (array, tensor)'s pieces as (box, chunks), in a canonical order: equal when the two
/// checkpoints hold that tensor in identical chunks (whichever ranks wrote them).
using piece_sig = std::tuple<int64_t, int64_t, int64_t, int64_t, std::vector<chunk_key>>;
std::map<std::pair<int, std::string>, std::vector<piece_sig>> signatures(const manifest& m) {
  std::map<std::pair<int, std::string>, std::vector<piece_sig>> out;
  for (const auto& p : m.pieces)
    out[{p.array, p.tensor}].emplace_back(p.where.row, p.where.col, p.where.rows, p.where.cols,
                                          p.chunks);
  for (auto& [k, v] : out) std::sort(v.begin(), v.end());
  return out;
}

struct difference {
  double max_abs = 0;
  bool nan = false;
};

difference compare(const std::vector<float>& a, const std::vector<float>& b, size_t offset,
                   size_t count) {
  difference d;
  for (size_t i = offset; i < offset + count; ++i) {
    if (a[i] == b[i]) continue;
    const double x = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(x))
      d.nan = true;
    else
      d.max_abs = std::max(d.max_abs, x);
  }
  return d;
}

}  // namespace

namespace {

// The step --step names, else the one LATEST names (which must be readable), and LATEST's step
// if it can be read; `verb` is the subcommand, for the hint.
std::pair<int64_t, std::optional<int64_t>> chosen_step(const std::string& run_dir,
                                                       std::optional<int64_t> step,
                                                       const std::string& verb) {
  std::optional<int64_t> latest;
  try {
    latest = step ? latest_step_or_none(run_dir) : latest_step(run_dir);
  } catch (const ckpt::checkpoint_error& e) {
    throw tool_error(std::string(e.what()) + " (" + verb + " a step directly with --step N)");
  }
  if (!step && !latest)
    throw tool_error(run_paths::checkpoints(run_dir).string() +
                     " has no LATEST: nothing committed; pick a step with --step N (see troupe "
                     "ckpt ls)");
  return {step ? *step : *latest, latest};
}

}  // namespace

int inspect(const std::string& run_dir, std::optional<int64_t> step) {
  const auto [chosen, latest] = chosen_step(run_dir, step, "inspect");
  const manifest m = ckpt::read_manifest(run_dir, chosen);
  std::printf("checkpoint %s%s\n", ckpt::format::step_dir(run_dir, m.step).c_str(),
              latest == m.step ? " (LATEST)" : "");
  std::vector<row> head = {
      {"step", std::to_string(m.step)},
      {"format", std::to_string(m.format_version)},
      {"world", std::to_string(m.world)},
      {"layout", layout_of(m)},
      {"seed", std::to_string(m.seed)},
      {"adam_t", chunked(m) ? std::to_string(m.adam_t) : "- (in the shard headers)"},
      {"chunk_floats",
       chunked(m) ? std::to_string(m.chunk_floats) + " (" + human(m.chunk_floats * 4) + " chunks)"
                  : "-"},
      {"global_numel",
       std::to_string(m.global_numel) + " (" + human(m.global_numel * 4) + " per array)"},
  };
  if (chunked(m)) {
    chunk_sizes sizes(run_dir);
    const auto keys = distinct_chunks(m);
    head.push_back({"chunks", std::to_string(keys.size()) + " distinct, " +
                                  human(sizes.total(keys)) + " on disk"});
  } else {
    head.push_back({"shards", std::to_string(m.shards.size()) + ", " + human(shard_bytes(m))});
  }
  head.push_back({"tensors", std::to_string(m.tensors.size())});
  print_table(head, "  ");

  if (!m.shards.empty()) {
    std::vector<row> rows = {{"rank", "file", "bytes", "range"}};
    for (const auto& s : m.shards)
      rows.push_back({std::to_string(s.rank), s.file, std::to_string(s.bytes),
                      "[" + std::to_string(s.range.offset) + ", " +
                          std::to_string(s.range.offset + s.range.count) + ")"});
    std::puts("shards:");
    print_table(rows, "  ");
  }
  // tensor -> array -> (pieces, ranks)
  std::map<std::string, std::array<std::pair<size_t, std::set<int>>, 3>> held;
  for (const auto& p : m.pieces) {
    if (p.array < 0 || p.array >= 3) continue;
    auto& cell = held[p.tensor][static_cast<size_t>(p.array)];
    ++cell.first;
    cell.second.insert(p.rank);
  }
  if (m.tensors.empty() && held.empty()) return 0;
  row header = {"tensor", "shape", "offset"};
  if (chunked(m))
    for (auto name : ckpt::array_names) header.emplace_back(name);
  std::vector<row> rows = {header};
  auto add = [&](const std::string& name, const std::string& shape, const std::string& offset) {
    row r = {name, shape, offset};
    if (chunked(m)) {
      auto it = held.find(name);
      for (size_t a = 0; a < 3; ++a) {
        if (it == held.end() || it->second[a].first == 0) {
          r.emplace_back("none");
          continue;
        }
        const auto& [pieces, ranks] = it->second[a];
        r.push_back(std::to_string(pieces) + (pieces == 1 ? " piece" : " pieces") +
                    (ranks.size() == 1 ? " (rank " : " (ranks ") + ranks_text(ranks) + ")");
      }
    }
    rows.push_back(std::move(r));
  };
  std::set<std::string> listed;
  for (const auto& t : m.tensors) {
    add(t.name, shape_text(t.shape), std::to_string(t.offset));
    listed.insert(t.name);
  }
  for (const auto& [name, cells] : held)
    if (!listed.contains(name)) add(name, "? (not in the tensor table)", "-");
  std::puts("tensors:");
  print_table(rows, "  ");
  return 0;
}

int diff(const std::string& run_dir, std::optional<std::pair<int64_t, int64_t>> pair) {
  if (!pair) {
    const auto steps = ckpt::list_committed(run_dir);
    if (steps.size() < 2)
      throw tool_error(run_paths::checkpoints(run_dir).string() + " holds " +
                       std::to_string(steps.size()) +
                       " committed checkpoint(s); diff needs two (or name steps A B)");
    pair = {steps[steps.size() - 2], steps.back()};
  }
  const manifest a = ckpt::read_manifest(run_dir, pair->first);
  const manifest b = ckpt::read_manifest(run_dir, pair->second);
  const std::string name_a = "step " + std::to_string(a.step);
  const std::string name_b = "step " + std::to_string(b.step);
  std::printf("diff of %s (A) and %s (B) in %s\n", name_a.c_str(), name_b.c_str(),
              run_paths::checkpoints(run_dir).c_str());
  const bool by_chunks = chunked(a) && chunked(b);
  if (by_chunks) {
    chunk_sizes sizes(run_dir);
    const auto ka = distinct_chunks(a), kb = distinct_chunks(b);
    std::set<chunk_key> shared, only_a, only_b;
    std::set_intersection(ka.begin(), ka.end(), kb.begin(), kb.end(),
                          std::inserter(shared, shared.end()));
    std::set_difference(ka.begin(), ka.end(), kb.begin(), kb.end(),
                        std::inserter(only_a, only_a.end()));
    std::set_difference(kb.begin(), kb.end(), ka.begin(), ka.end(),
                        std::inserter(only_b, only_b.end()));
    auto line = [&](const std::string& what, const std::set<chunk_key>& keys) {
      const uint64_t bytes = sizes.total(keys);
      return row{what, std::to_string(keys.size()) + " chunks", human(bytes),
                 std::to_string(bytes) + " bytes"};
    };
    print_table({line("shared", shared), line("only in A (" + name_a + ")", only_a),
                 line("only in B (" + name_b + ")", only_b)},
                "  ");
  } else {
    std::puts("  (a format 1 checkpoint holds no chunks: values compared only)");
  }
  if (a.global_numel != b.global_numel ||
      (!a.tensors.empty() && !b.tensors.empty() && a.tensors != b.tensors)) {
    std::printf(
        "different models (global_numel %zu vs %zu or other tensors): values not compared\n",
        a.global_numel, b.global_numel);
    return 0;
  }
  const auto fa = ckpt::load_full_state(run_dir, a);
  const auto fb = ckpt::load_full_state(run_dir, b);
  std::vector<ckpt::tensor_entry> tensors = a.tensors.empty() ? b.tensors : a.tensors;
  if (tensors.empty()) tensors.push_back({"(whole flat state)", {int64_t(a.global_numel)}, 0});
  const auto sig_a = signatures(a), sig_b = signatures(b);
  const std::vector<float>* arrays_a[3] = {&fa.params, &fa.exp_avg, &fa.exp_avg_sq};
  const std::vector<float>* arrays_b[3] = {&fb.params, &fb.exp_avg, &fb.exp_avg_sq};

  row header = {"tensor"};
  for (auto n : ckpt::array_names) header.emplace_back(n);
  std::vector<row> rows = {header};
  size_t same = 0, pairs = 0;
  double worst = 0;
  std::string worst_where;
  for (const auto& t : tensors) {
    row r = {t.name};
    const size_t n = numel_of(t.shape);
    for (int arr = 0; arr < 3; ++arr) {
      ++pairs;
      const auto& va = *arrays_a[arr];
      const auto& vb = *arrays_b[arr];
      if (by_chunks) {
        auto ia = sig_a.find({arr, t.name});
        auto ib = sig_b.find({arr, t.name});
        if (ia != sig_a.end() && ib != sig_b.end() && ia->second == ib->second) {
          ++same;
          r.emplace_back("same");
          continue;
        }
      }
      if (t.offset + n > va.size() || va.size() != vb.size()) {
        r.emplace_back("?");
        continue;
      }
      const difference d = compare(va, vb, t.offset, n);
      r.push_back(d.nan ? "nan" : number_text(d.max_abs));
      if (!std::isnan(worst) && (d.nan || d.max_abs > worst)) {
        worst = d.nan ? std::numeric_limits<double>::quiet_NaN() : d.max_abs;
        worst_where = std::string(ckpt::array_names[static_cast<size_t>(arr)]) + " of " + t.name;
      }
    }
    rows.push_back(std::move(r));
  }
  std::puts(by_chunks ? "per tensor: \"same\" = identical chunks, else max |A - B|:"
                      : "per tensor: max |A - B|:");
  print_table(rows, "  ");
  if (by_chunks)
    std::printf("%zu of %zu (array, tensor) pairs identical chunk for chunk\n", same, pairs);
  if (worst_where.empty())
    std::puts("largest difference: 0");
  else
    std::printf("largest difference: %s (%s)\n", number_text(worst).c_str(), worst_where.c_str());
  return 0;
}

int hash(const std::string& run_dir, std::optional<int64_t> step) {
  const manifest m = ckpt::read_manifest(run_dir, chosen_step(run_dir, step, "hash").first);
  const ckpt::full_state s = ckpt::load_full_state(run_dir, m);
  // Each array alone, then the whole state: the counters and every array's bytes, in order.
  ckpt::hasher64 all;
  all.update(&s.step, sizeof s.step);
  all.update(&s.adam_t, sizeof s.adam_t);
  std::string line = "step " + std::to_string(s.step) + " adam_t " + std::to_string(s.adam_t);
  const std::array<std::pair<const char*, const std::vector<float>*>, 3> arrays = {
      {{"params", &s.params}, {"exp_avg", &s.exp_avg}, {"exp_avg_sq", &s.exp_avg_sq}}};
  for (const auto& [name, values] : arrays) {
    ckpt::hasher64 one;
    one.update(values->data(), values->size() * sizeof(float));
    const uint64_t count = values->size();
    all.update(&count, sizeof count);
    all.update(values->data(), values->size() * sizeof(float));
    line += std::string(" ") + name + " " + ckpt::hash_to_hex(one.digest());
  }
  line += " state " + ckpt::hash_to_hex(all.digest());
  std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace troupe::cli::ckpt_tool
