#include "orion/common/status.h"

#include <gtest/gtest.h>

#include <string>

namespace orion {
namespace {

TEST(Result, HoldsAValueOrAnError) {
  const Result<std::string> v = std::string("seven");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, "seven");
  EXPECT_TRUE(v.status().ok());
  const Result<std::string> e = NotFound("no such thing");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), Code::kNotFound);
  EXPECT_EQ(e.status().message(), "no such thing");
}

// A Result built from an OK Status has no value: it must not read as a success without one
// (`if (!r.ok()) return r.status();` would return OK). It becomes an internal error that says so.
TEST(Result, FromAnOkStatusIsAnInternalError) {
  Result<std::string> r = Status();
  ASSERT_FALSE(r.ok());
  EXPECT_FALSE(r.status().ok());
  EXPECT_EQ(r.status().code(), Code::kInternal);
  EXPECT_EQ(r.status().message(), "a Result was built from an OK status, without a value");
}

}  // namespace
}  // namespace orion
