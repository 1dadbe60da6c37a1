#include "orion/common/text.h"

#include <gtest/gtest.h>

#include <string>

namespace orion {
namespace {

TEST(LogSafe, KeepsPrintableTextAndUtf8) {
  EXPECT_EQ(LogSafe("no vGPU free on 10.0.0.5:9960"), "no vGPU free on 10.0.0.5:9960");
  EXPECT_EQ(LogSafe("caf\xC3\xA9 \xE2\x9C\x93"), "caf\xC3\xA9 \xE2\x9C\x93");
}

TEST(LogSafe, EscapesControlsAndForgedLines) {
  struct Case {
    std::string in, out;
  };
  const Case cases[] = {
      {"a\r\n[info] forged", "a\\x0d\\x0a[info] forged"},
      {"\x1b[31mred", "\\x1b[31mred"},
      {std::string("nul\0x", 5), "nul\\x00x"},
      {"del\x7f", "del\\x7f"},
      {"c1 \xC2\x9B"
       "2J",
       "c1 \\xc2\\x9b2J"},           // U+009B is CSI on 8-bit terminals
      {"back\\x1b", "back\\\\x1b"},  // a literal backslash cannot fake an escape
      {"\xff\xfe", "\\xff\\xfe"},
      {"\xC0\xAF", "\\xc0\\xaf"},           // overlong '/'
      {"\xED\xA0\x80", "\\xed\\xa0\\x80"},  // surrogate
      {"\xE2\x9C", "\\xe2\\x9c"},           // truncated
  };
  for (const Case& c : cases) EXPECT_EQ(LogSafe(c.in), c.out) << c.in;
}

TEST(LogSafe, CapsLength) {
  const std::string big(65536, 'A');
  const std::string s = LogSafe(big);
  EXPECT_EQ(s, std::string(kLogSafeMax, 'A') + "...(+" + std::to_string(65536 - kLogSafeMax) + " bytes)");
  const std::string ctl(65536, '\n');
  EXPECT_LE(LogSafe(ctl).size(), 4 * kLogSafeMax + 24);
  EXPECT_EQ(LogSafe("\xE2\x9C\x93", 2), "\\xe2\\x9c...(+1 bytes)");  // a character cut by the cap
}

TEST(ValidUtf8, ReplacesInvalidSequences) {
  EXPECT_EQ(ValidUtf8("plain"), "plain");
  EXPECT_EQ(ValidUtf8("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(ValidUtf8("\xff\xfeprobe"), "\xEF\xBF\xBD\xEF\xBF\xBDprobe");
  EXPECT_EQ(ValidUtf8("x\xE2\x9C"), "x\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(ValidUtf8("\xF5\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // past U+10FFFF
}

TEST(RandomUuid, IsCanonicalVersion4AndDiffers) {
  const std::string a = RandomUuid(), b = RandomUuid();
  EXPECT_TRUE(IsUuid(a)) << a;
  EXPECT_EQ(a[14], '4') << a;                                          // version 4
  EXPECT_NE(std::string("89ab").find(a[19]), std::string::npos) << a;  // variant 10
  EXPECT_NE(a, b);
}

TEST(IsUuid, AcceptsOnlyCanonicalUuids) {
  EXPECT_TRUE(IsUuid("0f8fad5b-d9cb-469f-a165-70867728950e"));
  EXPECT_TRUE(IsUuid("0F8FAD5B-D9CB-469F-A165-70867728950E"));
  const char* bad[] = {"",
                       "0f8fad5b-d9cb-469f-a165-70867728950",
                       "0f8fad5b-d9cb-469f-a165-70867728950e0",
                       "0f8fad5bxd9cb-469f-a165-70867728950e",
                       "0f8fad5b-d9cb-469f-a165-70867728950g",
                       "../../v1/servers/victim-0000-00000000",
                       "0f8fad5b-d9cb-469f-a165-7086772\r\n50e",
                       "0f8fad5b-d9cb-469f-a165-70867728950e?reason=x"};
  for (const char* s : bad) EXPECT_FALSE(IsUuid(s)) << s;
}

}  // namespace
}  // namespace orion
