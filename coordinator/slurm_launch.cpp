#include "coordinator/slurm_launch.hpp"

#include <unistd.h>

#include <cstdlib>

#include "actors/wire/node_address.hpp"
#include "checkpoint/durable_io.hpp"
#include "runtime/config.hpp"
#include "runtime/sys/run_paths.hpp"
#include "runtime/sys/small_file.hpp"

namespace troupe::coordinator {
namespace {

std::string find_on_path(const std::string& tool) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t colon = dirs.find(':', start);
    if (colon == std::string::npos) colon = dirs.size();
    const std::string dir = dirs.substr(start, colon - start);
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + tool;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = colon + 1;
  }
  return "";
}

}  // namespace

std::string slurm_listen_host(const slurm_env& job) {
  const std::string fix =
      "; pass --host ADDR (an address of this node that the other nodes reach), or set "
      "TROUPE_IFACE=NAME";
  try {
    const auto named = actors::choose_node_address("", "");
    if (named.named()) return actors::resolve_node_address(named);
  } catch (const actors::node_address_error& e) {
    throw config_error(std::string("the coordinator's address (--slurm): ") + e.what());
  }
  actors::address_choice self;
  self.advertise = job.node_name;
  self.from = "SLURMD_NODENAME";
  if (self.advertise.empty()) {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    self.advertise = name;
    self.from = "the host name";
  }
  std::string address;
  try {
    address = actors::resolve_node_address(self);
  } catch (const actors::node_address_error& e) {
    throw config_error(std::string("the coordinator's address (--slurm): ") + e.what() + fix);
  }
  if (address.rfind("127.", 0) == 0)
    throw config_error("the coordinator's address (--slurm): " + self.from + "=" + self.advertise +
                       " resolves to " + address +
                       ", a loopback address the other nodes cannot reach" + fix);
  return address;
}

void write_rendezvous(const std::string& run_dir, const rendezvous& r) {
  ckpt::io::write_file_atomically(run_paths::rendezvous(run_dir), to_json(r));
}

void remove_rendezvous(const std::string& run_dir, int64_t pid) {
  const std::string path = run_paths::rendezvous(run_dir).string();
  std::string why;
  if (auto text = sys::read_small_file(path, why)) {
    try {
      if (parse_rendezvous(*text).pid != pid) return;
    } catch (const std::exception&) {
      return;  // not ours to judge
    }
    ::unlink(path.c_str());
  }
}

std::vector<std::string> srun_agents_command(const std::string& exe, int nodes) {
  const std::string srun = find_on_path("srun");
  if (srun.empty())
    throw config_error("--slurm: srun is not on PATH (" +
                       std::string(std::getenv("PATH") ? std::getenv("PATH") : "") +
                       "); it starts the agents");
  const std::string n = std::to_string(nodes);
  return {srun,
          "--no-kill",
          "--kill-on-bad-exit=0",
          "--nodes=" + n,
          "--ntasks=" + n,
          "--ntasks-per-node=1",
          "--job-name=troupe-agents",
          exe,
          "agent"};
}

void require_srun() { (void)srun_agents_command("troupe", 1); }

}  // namespace troupe::coordinator
