// What a scheduler tells a job's processes: Slurm hostlists and variables, a Kubernetes
// Indexed Job's index, the rendezvous file, and what `--slurm` makes of them.

#include "runtime/cluster_env.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/options.hpp"

namespace troupe::cli {
namespace {

using names = std::vector<std::string>;

names expand(const std::string& expr) { return expand_hostlist(expr, "SLURM_JOB_NODELIST"); }

TEST(HostlistTest, ExpandsAsScontrolShowHostnames) {
  EXPECT_EQ(expand(""), names{});
  EXPECT_EQ(expand("node1"), names{"node1"});
  EXPECT_EQ(expand("node[1-3]"), (names{"node1", "node2", "node3"}));
  EXPECT_EQ(expand("node[1-2,5],login"), (names{"node1", "node2", "node5", "login"}));
  EXPECT_EQ(expand("gpu[08-10]"), (names{"gpu08", "gpu09", "gpu10"}));
  EXPECT_EQ(expand("a[1-2]b[3,5]"), (names{"a1b3", "a1b5", "a2b3", "a2b5"}));
  EXPECT_EQ(expand("rack1-n[1-2],rack2-n7"), (names{"rack1-n1", "rack1-n2", "rack2-n7"}));
}

TEST(HostlistTest, MalformedListsNameTheVariable) {
  for (const char* bad : {"node[1-", "node1-3]", "node[3-1]", "node[a-b]", "node[]", "a,,b"}) {
    try {
      expand(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const usage_error& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_JOB_NODELIST"), std::string::npos) << e.what();
    }
  }
}

TEST(SlurmEnvTest, OutsideSlurmThereIsNone) {
  EXPECT_FALSE(read_slurm_env(environment_of({})));
  EXPECT_FALSE(read_completion_index(environment_of({})));
}

TEST(SlurmEnvTest, BatchScriptAndStep) {
  auto batch = read_slurm_env(environment_of({{"SLURM_JOB_ID", "42"},
                                              {"SLURM_JOB_NODELIST", "node[1-2]"},
                                              {"SLURM_JOB_NUM_NODES", "2"},
                                              {"SLURM_NTASKS_PER_NODE", "2"},
                                              {"SLURMD_NODENAME", "node1"},
                                              {"SLURM_RESTART_COUNT", "1"}}));
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->job_nodes, (names{"node1", "node2"}));
  EXPECT_EQ(batch->job_num_nodes, 2);
  EXPECT_EQ(batch->tasks_per_node, 2);
  EXPECT_FALSE(batch->in_step);
  EXPECT_EQ(batch->attempt(), "slurm:42.1");

  auto step = read_slurm_env(environment_of({{"SLURM_JOB_ID", "42"},
                                             {"SLURM_JOB_NODELIST", "node[1-2]"},
                                             {"SLURM_STEP_ID", "0"},
                                             {"SLURM_NODEID", "1"},
                                             {"SLURM_LOCALID", "0"},
                                             {"SLURM_STEP_NODELIST", "node[1-2]"},
                                             {"SLURM_NNODES", "2"},
                                             {"SLURM_NTASKS_PER_NODE", "2(x2)"}}));
  ASSERT_TRUE(step);
  EXPECT_TRUE(step->in_step);
  EXPECT_EQ(step->node_id, 1);
  EXPECT_EQ(step->step_num_nodes, 2);
  EXPECT_EQ(step->tasks_per_node, 0) << "2(x2) is not one number";
  EXPECT_EQ(step->attempt(), "slurm:42.0");
}

TEST(SlurmEnvTest, MalformedVariablesAreNamed) {
  const auto error_of = [](std::map<std::string, std::string> vars) -> std::string {
    try {
      read_slurm_env(environment_of(std::move(vars)));
    } catch (const usage_error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of({{"SLURM_JOB_ID", "42"},
                      {"SLURM_STEP_ID", "0"},
                      {"SLURM_NODEID", "x"},
                      {"SLURM_LOCALID", "0"}})
                .find("SLURM_NODEID"),
            std::string::npos);
  EXPECT_NE(error_of({{"SLURM_JOB_ID", "42"}, {"SLURM_STEP_ID", "0"}, {"SLURM_LOCALID", "0"}})
                .find("SLURM_NODEID is not set"),
            std::string::npos);
  EXPECT_NE(
      error_of(
          {{"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NUM_NODES", "3"}, {"SLURM_JOB_NODELIST", "n[1-2]"}})
          .find("SLURM_JOB_NUM_NODES"),
      std::string::npos);
  EXPECT_NE(error_of({{"SLURM_JOB_ID", "4;2"}}).find("SLURM_JOB_ID"), std::string::npos);
  EXPECT_NE(error_of({{"SLURM_JOB_ID", "42"},
                      {"SLURM_STEP_ID", "0"},
                      {"SLURM_NODEID", "2"},
                      {"SLURM_LOCALID", "0"},
                      {"SLURM_STEP_NUM_NODES", "2"}})
                .find("not below"),
            std::string::npos);
}

TEST(KubernetesEnvTest, CompletionIndex) {
  EXPECT_EQ(read_completion_index(environment_of({{"JOB_COMPLETION_INDEX", "3"}})), 3);
  EXPECT_THROW(read_completion_index(environment_of({{"JOB_COMPLETION_INDEX", "-1"}})),
               usage_error);
}

TEST(RendezvousTest, RoundTripAndStrictParsing) {
  rendezvous r{"slurm:42.0", "10.0.0.11", 41234, "node1", 2, 777};
  auto back = parse_rendezvous(to_json(r));
  EXPECT_EQ(back.job, r.job);
  EXPECT_EQ(back.host, r.host);
  EXPECT_EQ(back.port, r.port);
  EXPECT_EQ(back.node, r.node);
  EXPECT_EQ(back.nodes, 2);
  EXPECT_EQ(back.pid, 777);
  EXPECT_THROW(parse_rendezvous("not json"), std::runtime_error);
  EXPECT_THROW(parse_rendezvous("[]"), std::runtime_error);
  EXPECT_THROW(parse_rendezvous(R"({"job":"a","host":"h","port":0,"node":"n","nodes":1,"pid":1})"),
               std::runtime_error);
  EXPECT_THROW(
      parse_rendezvous(R"({"job":"a","host":"h","port":"1","node":"n","nodes":1,"pid":1})"),
      std::runtime_error);
  EXPECT_THROW(parse_rendezvous(std::string(5000, ' ')), std::runtime_error);
}

// `--slurm`: the allocation fills in what no option said; an option is honoured or refused.
TEST(SlurmOptionsTest, AllocationFillsNodesAndWorld) {
  const auto env = environment_of({{"SLURM_JOB_ID", "42"},
                                   {"SLURM_JOB_NODELIST", "node[1-2]"},
                                   {"SLURM_JOB_NUM_NODES", "2"},
                                   {"SLURM_NTASKS_PER_NODE", "2"}});
  auto o = parse_job_options({"--slurm"}, false, env);
  ASSERT_TRUE(o.slurm_job);
  EXPECT_EQ(o.cfg.elastic.nodes, 2);
  EXPECT_EQ(o.cfg.world, 4) << "2 nodes x SLURM_NTASKS_PER_NODE 2";
  EXPECT_FALSE(o.host_given);
  o = parse_job_options(
      {"--slurm", "--world", "2", "--nodes", "1", "--host", "10.0.0.1", "--port", "29400"}, false,
      env);
  EXPECT_EQ(o.cfg.elastic.nodes, 1);
  EXPECT_EQ(o.cfg.world, 2);
  EXPECT_TRUE(o.host_given);
  EXPECT_EQ(o.listen_host, "10.0.0.1");
  EXPECT_EQ(o.listen_port, 29400);
  o = parse_job_options({"--slurm", "--set", "world=2"}, false, env);
  EXPECT_EQ(o.cfg.world, 2);
}

TEST(SlurmOptionsTest, WhatTheAllocationCannotGiveIsRefused) {
  const auto env = environment_of({{"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NODELIST", "node[1-2]"}});
  try {
    parse_job_options({"--slurm", "--nodes", "3", "--world", "4"}, false, env);
    ADD_FAILURE() << "3 nodes of 2 accepted";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("--nodes 3"), std::string::npos) << e.what();
  }
  try {
    parse_job_options({"--slurm"}, false, environment_of({}));
    ADD_FAILURE() << "--slurm outside Slurm accepted";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_JOB_ID"), std::string::npos) << e.what();
  }
  try {
    parse_job_options({"--host", "10.0.0.1"}, false, environment_of({}));
    ADD_FAILURE() << "troupe run --host without --slurm accepted";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("--slurm"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(parse_job_options({"--slurm", "--help"}, false, environment_of({})).help);
}

}  // namespace
}  // namespace troupe::cli
