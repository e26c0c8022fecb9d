// The one escaping of outside text (issue 24): valid UTF-8 out, nothing a terminal obeys, and
// escaping twice changes nothing.
#include "runtime/sys/printable.hpp"

#include <gtest/gtest.h>

namespace troupe::sys {
namespace {

TEST(printable, PlainTextAndWellFormedUtf8StayAsTheyAre) {
  EXPECT_EQ(printable("step-00000010 ok"), "step-00000010 ok");
  EXPECT_EQ(printable("gr\xC3\xBC\xC3\x9F \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "gr\xC3\xBC\xC3\x9F \xE2\x82\xAC \xF0\x9F\x98\x80");
  EXPECT_EQ(printable("a\\b"), "a\\b");
}

TEST(printable, InvalidBytesAndControlsBecomeHexEscapes) {
  EXPECT_EQ(printable("\xff\xfe{"), "\\xff\\xfe{");
  EXPECT_EQ(printable("red \x1b[31m!"), "red \\x1b[31m!");
  EXPECT_EQ(printable("a\nb\tc\x7f"), "a\\x0ab\\x09c\\x7f");
  EXPECT_EQ(printable(std::string("nul\0!", 5)), "nul\\x00!");
  EXPECT_EQ(printable("\xC2\x9B"), "\\xc2\\x9b") << "a C1 control (CSI)";
  EXPECT_EQ(printable("\xC0\xAF"), "\\xc0\\xaf") << "an overlong '/'";
  EXPECT_EQ(printable("\xED\xA0\x80"), "\\xed\\xa0\\x80") << "a surrogate";
  EXPECT_EQ(printable("\xF4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80") << "past U+10FFFF";
  EXPECT_EQ(printable("cut \xE2\x82"), "cut \\xe2\\x82") << "a sequence cut short";
}

TEST(printable, EscapingTwiceChangesNothingAndLengthIsBounded) {
  const std::string once = printable("\xff\x1b[2J\xC3\xBC\\x41");
  EXPECT_EQ(printable(once), once);
  EXPECT_EQ(printable(std::string(100, 'x'), 10), std::string(10, 'x') + "...");
}

TEST(printable, LinesKeepTheirNewlinesAndNothingElse) {
  EXPECT_EQ(printable_lines("one\xff\ntwo\x1b\n"), "one\\xff\ntwo\\x1b\n");
}

}  // namespace
}  // namespace troupe::sys
