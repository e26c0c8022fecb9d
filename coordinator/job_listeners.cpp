// Step 2 of a job's coordinator: the metrics endpoint and the accounting of refused
// connections, set up before the run directory is touched.

#include <string>
#include <utility>

#include "coordinator/job_steps.hpp"
#include "monitoring/log.hpp"
#include "runtime/auth/credentials.hpp"

namespace troupe::coordinator {
namespace {

const monitoring::log_context coordinator_ctx{"coordinator", -1, 0, -1};

}  // namespace

job_listeners::job_listeners(const train_config& cfg) {
  // Every refused connection is counted by listener; the first few are logged with the peer's
  // address, then one line in 500, so a flood cannot flood the console too.
  auto& rejections = registry_.add_counter_family("troupe_rejected_connections_total",
                                                  actors::rejected_connections_help);
  rejections.with({{"listener", "coordinator"}});
  rejections.with({{"listener", "store"}});
  on_rejection_ = [this, &rejections](const std::string& listener, const std::string& peer,
                                      const std::string& why) {
    rejections.with({{"listener", listener}}).inc();
    const uint64_t n = ++refused_;
    if (n <= 20 || n % 500 == 0)
      monitoring::log(monitoring::level::warn, coordinator_ctx,
                      "refused a connection to the " + listener + " listener from " + peer + ": " +
                          why + " (" + std::to_string(n) + " refused so far)");
  };
  if (cfg.metrics_port != 0) {
    monitoring::metrics_server_limits limits;
    if (!cfg.metrics_token_file.empty()) {
      try {
        limits.bearer_token = auth::read_bearer_token(cfg.metrics_token_file);
      } catch (const auth::credentials_error& e) {
        throw config_error(std::string("metrics_token_file (--metrics-token): ") + e.what());
      }
    }
    limits.on_reject = [on_rejection = on_rejection_](const std::string& peer,
                                                      const std::string& why) {
      on_rejection("metrics", peer, why);
    };
    rejections.with({{"listener", "metrics"}});
    try {
      metrics_.emplace(registry_, cfg.metrics_host, static_cast<uint16_t>(cfg.metrics_port),
                       std::move(limits), &status_);
    } catch (const std::exception& e) {
      throw config_error(std::string("metrics_port: ") + e.what());
    }
  }
  // Last: a constructor that threw leaves no listener behind that points at it.
  actors::set_rejection_listener(on_rejection_);
}

job_listeners::~job_listeners() { actors::set_rejection_listener(nullptr); }

}  // namespace troupe::coordinator
