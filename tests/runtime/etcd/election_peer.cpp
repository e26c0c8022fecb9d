// A candidate in a process of its own, for tests that kill a leader outright.
// Usage: election_peer <endpoint>[,<endpoint>...] <job> <id> <ttl seconds>
// Prints "elected <epoch>" and "lost <reason>" lines as they happen; runs until killed.

#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>

#include "runtime/etcd/leader_election.hpp"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s <endpoints> <job> <id> <ttl seconds>\n", argv[0]);
    return 2;
  }
  troupe::etcd::client_options options;
  std::stringstream list(argv[1]);
  for (std::string url; std::getline(list, url, ',');) options.endpoints.push_back(url);
  options.request_timeout = std::chrono::milliseconds(1000);
  troupe::etcd::etcd_client client(options);
  troupe::etcd::election_options election;
  election.job = argv[2];
  election.id = argv[3];
  election.address = std::string(argv[3]) + ".example:1234";
  election.ttl = std::chrono::seconds(std::stoi(argv[4]));
  election.on_elected = [](std::int64_t epoch) {
    std::printf("elected %lld\n", static_cast<long long>(epoch));
    std::fflush(stdout);
  };
  election.on_lost = [](const std::string& reason) {
    std::printf("lost %s\n", reason.c_str());
    std::fflush(stdout);
  };
  troupe::etcd::leader_election candidate(client, election);
  candidate.start();
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
}
