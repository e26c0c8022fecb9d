// Who is in the job (actors/coordinator/job/membership.hpp), and the decisions that moved there
// from the actor: which workers an agent starts, the heartbeat interval a worker is told, and which
// processes a fault hits. Pure: no actors, the clock is an argument.

#include "actors/coordinator/job/membership.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "actors/coordinator/job_logic.hpp"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

const logic_time t0 = logic_time{} + 1000s;

job_params params(int members, int nodes = 1) {
  job_params p;
  p.members = members;
  p.nodes = nodes;
  p.max_restarts = 3;
  p.heartbeat_timeout = 2000ms;
  p.coordinator_timeout = 7000ms;
  return p;
}

agent_hello agent(int32_t pid, int32_t slots = 0) {
  agent_hello h;
  h.host = "node" + std::to_string(pid);
  h.pid = pid;
  h.slots = slots;
  return h;
}

hello worker(int32_t member, int32_t node = 0) {
  hello h;
  h.member = member;
  h.node = node;
  h.pid = 100 + member;
  h.host = "test";
  return h;
}

std::vector<std::string> event_names(const actions& a) {
  std::vector<std::string> out;
  for (const auto& x : a)
    if (auto* e = std::get_if<emit_event>(&x)) out.push_back(events::kind(e->event));
  return out;
}

TEST(HeartbeatInterval, IsAFifthOfTheTimeoutAndNeverBelowFiftyMilliseconds) {
  EXPECT_EQ(heartbeat_interval(2000ms), 400ms);
  EXPECT_EQ(heartbeat_interval(1000ms), 200ms);
  EXPECT_EQ(heartbeat_interval(250ms), 50ms);
  EXPECT_EQ(heartbeat_interval(100ms), 50ms);
}

TEST(AgentAdmission, TheFirstAgentsShareTheFirstMembersInSlices) {
  membership m(params(7, 3));
  std::vector<std::vector<int32_t>> slices;
  for (int i = 0; i < 3; ++i) {
    launch_plan plan;
    actions out;
    m.admit_agent(agent(10 + i), false, plan, out);
    ASSERT_TRUE(plan.error.empty()) << plan.error;
    EXPECT_EQ(plan.node, i);
    EXPECT_EQ(plan.max_restarts, 3);
    EXPECT_EQ(plan.coordinator_timeout_ms, 7000) << "agents outwait the coordinator's verdict";
    EXPECT_EQ(event_names(out), std::vector<std::string>{"agent_joined"});
    slices.push_back(plan.members);
  }
  // 7 members over 3 nodes: the first node takes the one left over.
  EXPECT_EQ(slices[0], (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(slices[1], (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(slices[2], (std::vector<int32_t>{5, 6}));
}

TEST(AgentAdmission, ALaterAgentMustOfferWorkersAndGetsNewMemberIds) {
  membership m(params(2, 1));
  launch_plan first;
  actions out;
  m.admit_agent(agent(10), false, first, out);
  ASSERT_EQ(first.members, (std::vector<int32_t>{0, 1}));

  launch_plan refused;
  m.admit_agent(agent(11), false, refused, out);
  EXPECT_NE(refused.error.find("already has its 1 agents"), std::string::npos) << refused.error;
  EXPECT_NE(refused.error.find("--ranks K"), std::string::npos);

  launch_plan extra;
  m.admit_agent(agent(12, 2), false, extra, out);
  ASSERT_TRUE(extra.error.empty()) << extra.error;
  EXPECT_EQ(extra.node, 1);  // the refused agent took no node number
  EXPECT_EQ(extra.members, (std::vector<int32_t>{2, 3}));
}

TEST(AgentAdmission, AnAgentWithSlotsAmongTheFirstStartsThatMany) {
  membership m(params(4, 2));
  launch_plan plan;
  actions out;
  m.admit_agent(agent(10, 3), false, plan, out);
  EXPECT_EQ(plan.members, (std::vector<int32_t>{0, 1, 2}));
}

TEST(AgentAdmission, RefusesAnotherProtocolAndAJobThatIsOver) {
  membership m(params(2, 1));
  launch_plan plan;
  actions out;
  agent_hello old = agent(10);
  old.protocol = protocol_version + 1;
  m.admit_agent(old, false, plan, out);
  EXPECT_NE(plan.error.find("protocol version"), std::string::npos);
  launch_plan over;
  m.admit_agent(agent(10), true, over, out);
  EXPECT_EQ(over.error, "the job is over");
  EXPECT_TRUE(out.empty());
  // Neither took a node: the next agent is node 0.
  launch_plan ok;
  m.admit_agent(agent(11), false, ok, out);
  EXPECT_EQ(ok.node, 0);
}

TEST(WorkerAdmission, TellsTheHeartbeatIntervalAndRefusesWhatCannotJoin) {
  membership m(params(2));
  actions out;
  welcome w;
  ASSERT_TRUE(m.admit(worker(0), true, false, t0, w, out));
  EXPECT_TRUE(w.error.empty());
  EXPECT_EQ(w.heartbeat_interval_ms, 400);
  EXPECT_EQ(event_names(out), std::vector<std::string>{"rank_joined"});

  welcome dup;
  EXPECT_FALSE(m.admit(worker(0), true, false, t0, dup, out));
  EXPECT_NE(dup.error.find("already joined"), std::string::npos);
  EXPECT_EQ(dup.heartbeat_interval_ms, 0);
  welcome bad;
  EXPECT_FALSE(m.admit(worker(-1), true, false, t0, bad, out));
  EXPECT_NE(bad.error.find("not a valid member id"), std::string::npos);
  welcome over;
  EXPECT_FALSE(m.admit(worker(1), true, true, t0, over, out));
  EXPECT_EQ(over.error, "the job is over");
  EXPECT_EQ(m.live_count(), 1);
}

TEST(WorkerAdmission, AMemberJoiningARunningJobWaitsIdleForTheNextGeneration) {
  membership m(params(1));
  actions out;
  welcome w;
  const member_info* late = m.admit(worker(5), false, false, t0, w, out);
  ASSERT_TRUE(late);
  EXPECT_TRUE(late->reported && late->reconfigured);  // the current generation waits not
  EXPECT_EQ(late->rank, -1);
  EXPECT_EQ(m.idle_count(), 1);
}

TEST(WorkerAdmission, ARestartedWorkerTakesItsMembersPlaceAfresh) {
  membership m(params(1));
  actions out;
  welcome w;
  m.admit(worker(0), true, false, t0, w, out);
  ASSERT_TRUE(m.lose(0, loss_cause::exit, "killed", 0, out));
  hello again = worker(0);
  again.pid = 999;
  ASSERT_TRUE(m.admit(again, false, false, t0 + 1s, w, out));
  EXPECT_EQ(m.members().size(), 1u);
  EXPECT_TRUE(m.current_process(0, 999));
  EXPECT_FALSE(m.current_process(0, 100));
}

// Two nodes, four workers; ranks placed as a generation would place them.
membership placed_job() {
  membership m(params(4, 2));
  actions out;
  for (int node = 0; node < 2; ++node) {
    launch_plan plan;
    m.admit_agent(agent(50 + node), false, plan, out);
    for (int32_t id : plan.members) {
      welcome w;
      m.admit(worker(id, node), true, false, t0, w, out);
    }
  }
  restore_plan r;
  r.member_of_rank = {0, 1, 2, 3};
  r.source.assign(4, state_source::init);
  r.source_rank.assign(4, -1);
  m.place(r);
  return m;
}

TEST(FaultVictims, ARankIsItsWorkerAndARankBeyondTheWorldWrapsAround) {
  membership m = placed_job();
  chaos::fault f;
  f.target = chaos::fault_target::rank;
  f.id = 2;
  EXPECT_EQ(m.fault_victims(f, 4), std::vector<int32_t>{102});
  // A random schedule drawn for 4 ranks after the world shrank to 3: rank 5 is rank 2.
  f.id = 5;
  EXPECT_EQ(m.fault_victims(f, 3), std::vector<int32_t>{102});
  actions out;
  m.lose(2, loss_cause::exit, "killed", 0, out);
  f.id = 2;
  EXPECT_TRUE(m.fault_victims(f, 4).empty());  // nobody holds rank 2 now
}

TEST(FaultVictims, ANodeIsItsAgentAndItsLiveWorkers) {
  membership m = placed_job();
  actions out;
  m.lose(3, loss_cause::exit, "killed", 0, out);
  chaos::fault f;
  f.target = chaos::fault_target::node;
  f.id = 1;
  EXPECT_EQ(m.fault_victims(f, 4), (std::vector<int32_t>{51, 102}));
  f.id = 7;  // no such node
  EXPECT_TRUE(m.fault_victims(f, 4).empty());
  f.target = chaos::fault_target::coordinator;
  f.id = -1;
  EXPECT_TRUE(m.fault_victims(f, 4).empty());  // the actor kills its own process
}

TEST(Heartbeats, SilentMembersAreNamedAndAnEvictedOneIsToldToGo) {
  membership m = placed_job();
  actions out;
  heartbeat beat;
  beat.member = 1;
  m.record_heartbeat(beat, t0 + 1500ms, out);
  const auto silent = m.silent(t0 + 2500ms);
  ASSERT_EQ(silent.size(), 3u);  // all but member 1
  EXPECT_EQ(silent[0].first, 0);
  EXPECT_NE(silent[0].second.find("no heartbeat for 2.50 s (timeout 2000 ms)"), std::string::npos)
      << silent[0].second;
  EXPECT_DOUBLE_EQ(m.heartbeat_ages(t0 + 2500ms, 4)[1], 1.0);

  m.lose(0, loss_cause::hang, "silent", 0, out);
  out.clear();
  beat.member = 0;  // a SIGSTOPped worker wakes up
  m.record_heartbeat(beat, t0 + 3s, out);
  EXPECT_EQ(event_names(out), std::vector<std::string>{"stale_message"});
  ASSERT_EQ(out.size(), 2u);
  const auto* abort = std::get_if<send_abort>(&out[1]);
  ASSERT_TRUE(abort);
  EXPECT_EQ(abort->member, 0);
  EXPECT_TRUE(abort->msg.final);
  // Lost to silence (a cut that healed, a stop that ended): removed, so its agent starts the
  // member again; never told it was evicted, which would make it exit for good.
  EXPECT_TRUE(abort->msg.reason.starts_with(removed_prefix)) << abort->msg.reason;
  EXPECT_EQ(m.stale_messages(), 1u);
  EXPECT_EQ(m.rejoin_refusal(0), abort->msg.reason);
  EXPECT_EQ(m.rejoin_refusal(1), "") << "a live member's rejoin is judged as usual";
  EXPECT_TRUE(m.rejoin_refusal(42).starts_with(removed_prefix)) << "unknown to this leader";
}

// A straggler evicted by the policy is told to go whenever it speaks again: neither its beat
// nor a rejoin brings it back, and it exits 0 so that its agent does not start it again.
TEST(Heartbeats, AnEvictedStragglerIsToldToGoNotToRejoin) {
  membership m = placed_job();
  actions out;
  m.lose(2, loss_cause::straggler, "compute 3x the median", 0, out);
  out.clear();
  heartbeat beat;
  beat.member = 2;
  m.record_heartbeat(beat, t0 + 1s, out);
  ASSERT_EQ(out.size(), 2u);
  const auto* abort = std::get_if<send_abort>(&out[1]);
  ASSERT_TRUE(abort);
  EXPECT_TRUE(abort->msg.reason.starts_with(evicted_prefix)) << abort->msg.reason;
  EXPECT_TRUE(m.rejoin_refusal(2).starts_with(evicted_prefix));
}

// An agent cut off from the coordinator stopped its workers; when it rejoins it names the
// members it ran, and gets back those no live process holds, never an evicted one.
TEST(AgentAdmission, ARejoiningCutOffAgentGetsBackItsMembersThatNoProcessHolds) {
  membership m(params(4, 2));
  actions out;
  launch_plan first, second;
  m.admit_agent(agent(10), false, first, out);
  m.admit_agent(agent(20), false, second, out);
  ASSERT_EQ(second.members, (std::vector<int32_t>{2, 3}));
  welcome w;
  for (int32_t id = 0; id < 4; ++id) m.admit(worker(id, id / 2), true, false, t0, w, out);
  m.lose(2, loss_cause::hang, "no heartbeat", 10, out);
  m.lose(3, loss_cause::hang, "no heartbeat", 10, out);
  agent_hello back = agent(20);
  back.rejoin = true;
  back.node = 1;
  back.former_members = {2, 3};
  launch_plan plan;
  m.readmit_agent(back, false, plan, out);
  EXPECT_EQ(plan.error, "");
  EXPECT_EQ(plan.node, 1);
  EXPECT_EQ(plan.members, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(plan.coordinator_timeout_ms, 7000);

  // Member 3 came back meanwhile (its own process rejoined), member 2 was evicted.
  m.admit(worker(3, 1), false, false, t0 + 5s, w, out);
  m.lose(3, loss_cause::straggler, "slow", 10, out);
  launch_plan again;
  back.former_members = {2, 3};
  m.readmit_agent(back, false, again, out);
  EXPECT_EQ(again.members, (std::vector<int32_t>{2})) << "an evicted member is not started again";
  m.admit(worker(2, 1), false, false, t0 + 6s, w, out);
  launch_plan none;
  m.readmit_agent(back, false, none, out);
  EXPECT_TRUE(none.members.empty()) << "member 2 is live again: nothing to start";
}

TEST(Generations, AbortingAsksEveryLiveMemberToReportAndReconfigureAgain) {
  membership m = placed_job();
  actions out;
  m.open_first_generation();
  m.lose(1, loss_cause::exit, "killed", 0, out);
  out.clear();
  m.next_generation();
  m.abort_live("rank 1 lost", out);
  EXPECT_EQ(out.size(), 3u);
  for (const auto& a : out) EXPECT_EQ(std::get<send_abort>(a).msg.generation, 2u);
  EXPECT_FALSE(m.everyone_reported());
  ASSERT_TRUE(m.first_unready());
  EXPECT_EQ(m.first_unready()->id, 0);
  m.assume_reports(7);
  EXPECT_TRUE(m.everyone_reported());
  EXPECT_EQ(m.find(2)->held_generation, 1u);
  EXPECT_EQ(m.find(2)->held_rank, 2);
  EXPECT_EQ(m.find(2)->held_step, 7);
}

// The same decisions through the facade, as the actor calls it.
TEST(JobLogicAdmission, AgentsAreAdmittedUntilTheJobIsOver) {
  job_params p = params(2, 1);
  p.cfg.world = 2;
  p.cfg.steps = 10;
  p.cfg.batch = 8;
  p.cfg.micro_batch = 2;
  p.cfg.model.n_layer = 2;
  p.cfg.model.n_head = 2;
  p.cfg.model.d_model = 32;
  p.cfg.model.context = 32;
  p.plan = strategies::plan_of(strategies::plan_layout(2, p.cfg));
  job_logic logic(p, t0);
  launch_plan plan;
  auto out = logic.on_agent_joined(agent(10), plan);
  EXPECT_EQ(plan.members, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(event_names(out), std::vector<std::string>{"agent_joined"});
  logic.on_shutdown(t0);  // forming: ends at once
  launch_plan late;
  EXPECT_TRUE(logic.on_agent_joined(agent(11, 2), late).empty());
  EXPECT_EQ(late.error, "the job is over");
}

}  // namespace
}  // namespace troupe::actors
