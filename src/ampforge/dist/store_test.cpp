// dist::TcpStore on loopback: the rendezvous of a torchrun-style job. Ranks are threads of this process
// (real sockets), and for a rank that dies, a real process (the dist worker) that exits without goodbye.
#include "ampforge/dist/store.h"

#include <chrono>
#include <future>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ampforge/dist/dist_test_util.h"
#include "ampforge/util/error.h"

namespace ampforge::dist {
namespace {

using ::testing::HasSubstr;
using testing::error_of;

StoreOptions opts(int rank, int world, int port, double timeout = 10) {
  StoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.rank = rank;
  o.world_size = world;
  o.is_server = rank == 0;
  o.timeout_s = timeout;
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(DistStore, SetGetAddAndBarrierAcrossRanks) {
  TcpStore server(opts(0, 3, 0));
  const int port = server.port();
  ASSERT_GT(port, 0);
  // Rank 2 asks for a key before rank 1 sets it: get waits.
  auto r2 = std::async(std::launch::async, [&] {
    TcpStore s(opts(2, 3, port));
    const std::string v = s.get("from/1");
    const int64_t c = s.add("count", 1);
    s.barrier("done");
    return v + " " + std::to_string(c);
  });
  auto r1 = std::async(std::launch::async, [&] {
    TcpStore s(opts(1, 3, port));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    s.set("from/1", "hello");
    EXPECT_TRUE(s.check({"from/1"}));
    EXPECT_FALSE(s.check({"from/1", "never"}));
    const int64_t c = s.add("count", 1);
    s.barrier("done");
    return c;
  });
  const int64_t c0 = server.add("count", 1);
  server.barrier("done");
  const std::string got2 = r2.get();
  const int64_t c1 = r1.get();
  EXPECT_THAT(got2, ::testing::StartsWith("hello "));
  EXPECT_EQ(server.add("count", 0), 3);  // three increments, in some order
  EXPECT_NE(c0, c1);
  server.wait({"done/0", "done/1", "done/2"});
  EXPECT_EQ(server.get("from/1"), "hello");
}

TEST(DistStore, BarrierNamesTheRankThatNeverArrives) {
  TcpStore server(opts(0, 3, 0, 1.0));
  const auto t0 = std::chrono::steady_clock::now();
  auto r1 = std::async(std::launch::async, [&] {
    TcpStore s(opts(1, 3, server.port(), 1.0));
    return error_of([&] { s.barrier("start"); });
  });
  const std::string e0 = error_of([&] { server.barrier("start"); });
  const std::string e1 = r1.get();
  const double took = seconds_since(t0);
  EXPECT_THAT(e0, HasSubstr("rank 2 did not arrive at 'start' within 1 s"));
  EXPECT_THAT(e1, HasSubstr("rank 2 did not arrive"));
  EXPECT_THAT(e0, HasSubstr("WORLD_SIZE=3"));
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 5.0);
}

TEST(DistStore, RankThatExitsWithoutGoodbyeFailsTheOthersAtOnce) {
  // A long timeout: the others must not wait for it once rank 1's process is gone.
  TcpStore server(opts(0, 2, 0, 60));
  const std::string cmd = "RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(server.port()) +
                          " " AMPFORGE_DIST_WORKER " store --exit-rank 1";
  auto child = std::async(std::launch::async, [&] { return testing::run_shell(cmd, 60); });
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { server.barrier("start"); });
  const double took = seconds_since(t0);
  EXPECT_EQ(child.get().code, 3);
  EXPECT_THAT(e, HasSubstr("rank 1 disconnected from the store without saying goodbye"));
  EXPECT_LT(took, 20.0);
}

TEST(DistStore, UnreachableMasterIsNamedWithinTheTimeout) {
  // A port nobody listens on: a store that was started and closed again.
  int port = 0;
  { port = TcpStore(opts(0, 1, 0)).port(); }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { TcpStore s(opts(1, 2, port, 1.0)); });
  const double took = seconds_since(t0);
  EXPECT_THAT(e, HasSubstr("rank 1: could not reach the store of rank 0 at 127.0.0.1:" + std::to_string(port) +
                           " within 1 s"));
  EXPECT_THAT(e, HasSubstr("Connection refused"));
  EXPECT_GE(took, 0.5);
  EXPECT_LT(took, 5.0);
}

TEST(DistStore, BadOptionsAndMisconfiguredRanksAreRefused) {
  EXPECT_THAT(error_of([] { TcpStore s(opts(2, 2, 1234)); }), HasSubstr("RANK 2 is not in [0, WORLD_SIZE=2)"));
  EXPECT_THAT(error_of([] { TcpStore s(opts(1, 2, 0)); }), HasSubstr("MASTER_PORT must be in [1, 65535]"));
  StoreOptions bad = opts(1, 2, 1234, 1.0);
  bad.host = "no-such-host.invalid";
  EXPECT_THAT(error_of([&] { TcpStore s(bad); }), HasSubstr("MASTER_ADDR 'no-such-host.invalid' does not resolve"));
  TcpStore server(opts(0, 2, 0, 2.0));
  // Another process that also believes it is rank 0, and one with another WORLD_SIZE.
  StoreOptions twin = opts(0, 2, server.port(), 2.0);
  twin.is_server = false;
  EXPECT_THAT(error_of([&] { TcpStore s(twin); }), HasSubstr("two processes have RANK=0"));
  EXPECT_THAT(error_of([&] { TcpStore s(opts(1, 3, server.port(), 2.0)); }),
              HasSubstr("rank 1 has WORLD_SIZE=3, rank 0 has 2"));
  // The port is taken: rank 0 of another job cannot serve there.
  EXPECT_THAT(error_of([&] { TcpStore s(opts(0, 2, server.port())); }), HasSubstr("cannot listen on MASTER_PORT"));
}

TEST(DistStore, GetAndWaitTimeOutNamingTheKeys) {
  TcpStore server(opts(0, 1, 0, 0.5));
  server.set("present", "1");
  EXPECT_THAT(error_of([&] { server.get("absent"); }), HasSubstr("key 'absent' was not set"));
  EXPECT_THAT(error_of([&] { server.wait({"present", "absent", "gone"}); }), HasSubstr("keys 'absent', 'gone' were "
                                                                                      "not set"));
}

}  // namespace
}  // namespace ampforge::dist
