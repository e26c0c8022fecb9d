// main() for the test binaries with a test that can skip (GTEST_SKIP where this machine cannot
// run it: no promtool, no TCP MD5, no GPU, a descriptor limit too low). It exits 77 when a test
// skipped and none failed, which CTest (SKIP_RETURN_CODE 77) reports as Skipped, not Passed; a
// failure still exits 1. SKIP_REGULAR_EXPRESSION on "[  SKIPPED ]" would not do: CTest then
// marks the whole binary skipped whatever its exit code, hiding a failure beside the skip.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  if (failed != 0) return failed;
  return ::testing::UnitTest::GetInstance()->skipped_test_count() > 0 ? 77 : 0;
}
