// httplib.h against the libcpp-httplib it links: Debian builds the library with
// CPPHTTPLIB_OPENSSL_SUPPORT, which adds members to httplib::Client and httplib::Request. A file
// that includes the header without it gets smaller objects than the library's constructors and
// senders fill: the etcd store's Client on the stack lost a byte of its neighbour to `is_ssl_`, and
// the connection front's Request was read 8 bytes short. These tests fail when the header and the
// library disagree.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstring>
#include <new>

namespace {

TEST(HttplibAbi, TheLibrarysClientConstructorStaysInsideOurClient) {
  constexpr size_t kSlack = 32;
  alignas(httplib::Client) unsigned char buf[sizeof(httplib::Client) + kSlack];
  std::memset(buf, 0xA5, sizeof buf);
  auto* c = new (buf) httplib::Client("127.0.0.1", 9);  // the constructor is in the library
  for (size_t i = sizeof(httplib::Client); i < sizeof buf; ++i) {
    EXPECT_EQ(buf[i], 0xA5) << "the library wrote byte " << i << " of a " << sizeof(httplib::Client) << "-byte Client";
  }
  c->~Client();
}

TEST(HttplibAbi, RequestHasTheLibrarysTlsMember) {
#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
  FAIL() << "httplib.h is included without CPPHTTPLIB_OPENSSL_SUPPORT, unlike Debian's libcpp-httplib";
#else
  httplib::Request r;
  EXPECT_EQ(r.ssl, nullptr);  // present, as in the library's layout
#endif
}

}  // namespace
