// --fault specs: every kind parses, every malformed spec is refused with its field named.

#include "chaos/fault_spec.hpp"

#include <gtest/gtest.h>

#include "runtime/config.hpp"

namespace troupe::chaos {
namespace {

TEST(FaultSpecTest, ParsesEveryKind) {
  auto k = parse_fault("kill:rank=1:step=8", 4, 2, 100);
  EXPECT_EQ(k.kind, fault_action::kill);
  EXPECT_EQ(k.target, fault_target::rank);
  EXPECT_EQ(k.id, 1);
  EXPECT_EQ(k.step, 8);
  auto n = parse_fault("kill:node=1:step=12", 4, 2, 100);
  EXPECT_EQ(n.target, fault_target::node);
  auto s = parse_fault("stop:rank=2:step=5:for=3s", 4, 2, 100);
  EXPECT_EQ(s.kind, fault_action::stop);
  EXPECT_EQ(s.duration, std::chrono::milliseconds(3000));
  EXPECT_EQ(parse_fault("stop:rank=2:step=5:for=250ms", 4, 2, 100).duration,
            std::chrono::milliseconds(250));
  auto list = parse_faults("kill:rank=0:step=9;kill:rank=1:step=3", 4, 1, 100);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].step, 3);
}

TEST(FaultSpecTest, RefusesWhatItCannotDo) {
  for (const char* bad :
       {"", "explode:rank=1:step=2", "kill:rank=4:step=2", "kill:rank=1", "kill:step=2",
        "kill:rank=1:node=0:step=2", "kill:rank=1:step=0", "kill:rank=1:step=101",
        "kill:rank=1:step=2:for=3s", "stop:node=0:step=2", "stop:rank=1:step=2:for=3",
        "kill:rank=x:step=2", "kill:rank=1:step=2:color=red", "kill:rank=1:rank=1:step=2",
        "kill:rank=1:step=99999999999999999999", "kill:rank=1:step=2:"})
    EXPECT_THROW(parse_fault(bad, 4, 1, 100), config_error) << bad;
}

}  // namespace
}  // namespace troupe::chaos
