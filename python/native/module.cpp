// troupe._native: the C++ half of the `troupe` Python module (python/troupe/). A Session is one
// worker of a job living inside the user's Python process: the runtime's rank thread (the step
// transaction, control, heartbeats, data plane) runs beside the script's thread, and the two
// meet in a host_link. Every blocking call releases the GIL; no runtime thread ever touches a
// Python object.

#include <dlfcn.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "actors/worker/rank.hpp"
#include "actors/worker/worker_environment.hpp"
#include "python/native/host_link.hpp"
#include "python/native/host_workload.hpp"
#include "runtime/data/random.hpp"
#include "runtime/data/sampler.hpp"
#include "runtime/sys/warm_memory.hpp"
#include "runtime/trainer.hpp"

namespace py = pybind11;

namespace troupe::python {
namespace {

// Whether this extension's bind() and connect() are the ones every library of the process calls
// (its agent preloaded it), as the troupe binary's are: only then are gloo's pairs signed and
// their connects abortable (runtime/comm/tcp_signature.hpp).
bool interposed() {
  static const int marker = 0;
  Dl_info self{};
  if (dladdr(&marker, &self) == 0 || self.dli_fname == nullptr) return false;
  void* handle = dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  void* mine = dlsym(handle, "bind");
  dlclose(handle);
  return mine != nullptr && mine == dlsym(RTLD_DEFAULT, "bind");
}

// Said once, where the job's data plane wants signed pairs and this process cannot sign them.
void warn_unless_interposed(const job_settings& s) {
  if (interposed()) return;
  const auto cfg = nlohmann::json::parse(s.config_json, nullptr, false);
  if (!cfg.is_object() || cfg.value("data_plane_auth", std::string()) != "tcp-md5") return;
  std::fprintf(stderr,
               "troupe: warning: this worker's gloo TCP pairs cannot be signed (--data-plane-auth "
               "tcp-md5): the troupe module was not preloaded. Start the workers' program as a "
               "Python interpreter (`-- python3 train.py`), so that the agent preloads it\n");
}

py::dict dict_of(const job_settings& s) {
  py::dict d;
  d["steps"] = s.steps;
  d["last_step"] = s.last_step;
  d["batch"] = s.global_batch;
  d["micro_batch"] = s.micro_batch;
  d["seed"] = s.seed;
  d["bucket_bytes"] = s.bucket_bytes;
  d["threads"] = s.compute_threads;
  d["run_dir"] = s.run_dir;
  return d;
}

const char* kind_name(ask_kind k) {
  switch (k) {
    case ask_kind::step:
      return "step";
    case ask_kind::apply:
      return "apply";
    case ask_kind::init:
      return "init";
    case ask_kind::begin_restore:
      return "begin_restore";
    case ask_kind::end_restore:
      return "end_restore";
    case ask_kind::cancel_restore:
      return "cancel_restore";
    case ask_kind::ended:
      return "ended";
    case ask_kind::state:
      return "state";
  }
  return "?";
}

// One worker of a job in this process.
class session {
 public:
  session() : link_(std::make_shared<host_link>()) {}
  ~session() { detach(); }
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  // Joins the job: the runtime's thread connects, says hello (a standby first waits for its
  // member id), and builds the workload once the welcome brings the settings. Returns them,
  // or nothing when the process was not needed (a standby told so) or could not join; then
  // `exit_code()` says how it ended.
  std::optional<job_settings> start(const std::string& name) {
    actors::worker_args args = actors::worker_args_from_environment();
    auto factory = [this, name](const job_settings& s) {
      {
        std::lock_guard lock(mu_);
        settings_ = s;
      }
      cv_.notify_all();
      return make_host_workload(link_, name);
    };
    runtime_ = std::thread([this, args, factory] {
      int code = 1;
      try {
        code = actors::run_worker(args, factory);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "troupe: the worker runtime failed: %s\n", e.what());
      }
      link_->end(code, code == 0 ? "" : "the worker ended with exit code " + std::to_string(code),
                 code == 0);
      {
        std::lock_guard lock(mu_);
        exit_code_ = code;
      }
      cv_.notify_all();
    });
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return settings_.has_value() || exit_code_.has_value(); });
    if (settings_) warn_unless_interposed(*settings_);
    return settings_;
  }

  // Gradient buckets: (address, float count) of each, in index order.
  void set_buckets(const std::vector<std::pair<uintptr_t, size_t>>& buckets) {
    std::vector<gradient_bucket> out;
    out.reserve(buckets.size());
    for (const auto& [address, count] : buckets)
      // NOLINTNEXTLINE(performance-no-int-to-ptr): torch hands over memory as data_ptr()
      out.push_back({std::span<float>(reinterpret_cast<float*>(address), count)});
    link_->set_buckets(std::move(out));
  }

  // The script's state: (name, array, role, dtype, shape, address) per tensor, and the rest as
  // JSON.
  void set_state(const std::vector<std::tuple<std::string, std::string, int, std::string,
                                              std::vector<int64_t>, uintptr_t>>& entries,
                 const std::string& extras_json) {
    std::vector<held_tensor> held;
    held.reserve(entries.size());
    for (const auto& [name, array, role, dtype_text, shape, address] : entries) {
      held_tensor t;
      t.decl.name = name;
      t.decl.array = array;
      t.decl.shape = shape;
      const auto type = parse_dtype(dtype_text);
      if (!type) throw std::invalid_argument("tensor " + name + ": unknown dtype " += dtype_text);
      t.decl.type = *type;
      if (role < 0 || role > static_cast<int>(tensor_role::extra))
        throw std::invalid_argument("tensor " + name + ": unknown role");
      t.decl.role = static_cast<tensor_role>(role);
      t.data = reinterpret_cast<std::byte*>(address);  // NOLINT(performance-no-int-to-ptr)
      held.push_back(std::move(t));
    }
    if (extras_json.size() > state_view::max_extras_bytes)
      throw std::invalid_argument("the state's non-tensor part is " +
                                  std::to_string(extras_json.size()) +
                                  " bytes of JSON, more than the 1 MiB allowed");
    link_->set_state(std::move(held), extras_json);
  }

  // The next thing the runtime asks of the script: (kind, details).
  py::tuple next() {
    ask a;
    {
      py::gil_scoped_release unlocked;
      a = link_->next();
    }
    py::dict d;
    d["generation"] = a.generation;
    d["rank"] = a.rank;
    d["world"] = a.world;
    switch (a.kind) {
      case ask_kind::step:
        d["step"] = a.work.step;
        d["data_position"] = a.work.data_position;
        d["first"] = a.work.share.first;
        d["count"] = a.work.share.count;
        d["micro_batch"] = a.work.share.micro_batch;
        d["global_batch"] = a.work.global_batch;
        d["seed"] = a.work.seed;
        break;
      case ask_kind::apply:
        d["step"] = a.work.step;
        d["loss"] = a.job_loss;
        break;
      case ask_kind::begin_restore: {
        py::list tensors;
        for (const auto& t : a.tensors)
          tensors.append(py::make_tuple(t.name, t.array, static_cast<int>(t.role),
                                        std::string(dtype_name(t.type)), t.shape));
        d["tensors"] = tensors;
        d["extras"] = a.extras_json;
        break;
      }
      case ask_kind::ended:
        d["code"] = a.exit_code;
        d["why"] = a.why;
        d["finished"] = a.finished;
        break;
      default:
        break;
    }
    return py::make_tuple(kind_name(a.kind), d);
  }

  void reply(const std::string& error, double loss_sum, int64_t count) {
    link_->reply({error, loss_sum, count});
  }
  void ready(size_t bucket) { link_->ready(bucket); }
  bool superseded() const { return link_->superseded(); }
  void fail(const std::string& why) { link_->fail(why); }

  // Waits (GIL released) for the runtime's thread to end, at most `seconds`; its exit code,
  // or None when it still runs.
  std::optional<int> wait_end(double seconds) {
    py::gil_scoped_release unlocked;
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                 [&] { return exit_code_.has_value(); });
    if (exit_code_ && runtime_.joinable()) {
      lock.unlock();
      runtime_.join();
      lock.lock();
    }
    return exit_code_;
  }

 private:
  // A runtime thread that outlives the session (the process exits around it) is left
  // detached; joining it could wait for a job that never ends.
  void detach() {
    if (runtime_.joinable()) runtime_.detach();
  }

  std::shared_ptr<host_link> link_;
  std::thread runtime_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<job_settings> settings_;
  std::optional<int> exit_code_;
};

}  // namespace
}  // namespace troupe::python

PYBIND11_MODULE(_native, m) {
  using troupe::python::session;
  m.doc() = "troupe's worker runtime, hosted in a Python process (see the troupe module)";
  py::class_<session>(m, "Session")
      .def(py::init<>())
      .def(
          "start",
          [](session& s, const std::string& name) -> py::object {
            std::optional<troupe::job_settings> got;
            {
              py::gil_scoped_release unlocked;
              got = s.start(name);
            }
            if (!got) return py::none();
            return troupe::python::dict_of(*got);
          },
          py::arg("name"))
      .def("set_buckets", &session::set_buckets)
      .def("set_state", &session::set_state)
      .def("next", &session::next)
      .def("reply", &session::reply, py::arg("error") = "", py::arg("loss_sum") = 0.0,
           py::arg("count") = 0)
      .def("ready", &session::ready)
      .def("superseded", &session::superseded)
      .def("fail", &session::fail)
      .def("wait_end", &session::wait_end);
  m.def("interposed", &troupe::python::interposed,
        "whether gloo's sockets go through troupe's bind()/connect() (signed, abortable)");
  m.def("set_blas_threads", &troupe::set_blas_threads,
        "OpenBLAS's threads (torch's matrix products on Debian use it, and do not follow "
        "torch.set_num_threads)");
  m.def("retain_freed_memory", &troupe::sys::retain_freed_memory,
        "keep freed memory in the process (one arena, no trimming), as a troupe worker does");
  m.def(
      "sample_indices",
      [](uint64_t seed, int64_t length, int global_batch, int64_t position, int first, int count,
         bool shuffle) {
        const troupe::sampler s(seed, length, global_batch, shuffle);
        return s.indices(position, {first, count, std::max(1, count)});
      },
      py::arg("seed"), py::arg("length"), py::arg("global_batch"), py::arg("position"),
      py::arg("first"), py::arg("count"), py::arg("shuffle") = true);
  m.def(
      "micro_batch_seed",
      [](uint64_t seed, int64_t position, int64_t index) {
        // A constant of the frontend's, so these seeds meet no other use of the job's seed;
        // kept below 2^63 for torch.manual_seed.
        return troupe::hash_words(seed, static_cast<uint64_t>(position),
                                  static_cast<uint64_t>(index), 0x7079746f72636821ull) >>
               1;
      },
      py::arg("seed"), py::arg("position"), py::arg("index"));
}
