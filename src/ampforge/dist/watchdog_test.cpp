// The collective watchdog against a fake engine: markers that complete when the test says so, an asynchronous
// error the test sets, and an abort and a process exit that are only recorded.
#include "ampforge/dist/watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "ampforge/util/error.h"

namespace ampforge::dist {
namespace {

using namespace std::chrono_literals;

class FakeEngine final : public WatchdogBackend {
 public:
  bool query(void* marker, std::string* error) override {
    std::lock_guard<std::mutex> lock(mu);
    if (marker == failing) *error = "an illegal memory access was encountered";
    return done.count(marker) > 0;
  }
  void release(void* marker) override {
    std::lock_guard<std::mutex> lock(mu);
    released.insert(marker);
  }
  std::string async_error() override {
    std::lock_guard<std::mutex> lock(mu);
    return async;
  }
  void abort() override { ++aborts; }

  void complete(void* marker) {
    std::lock_guard<std::mutex> lock(mu);
    done.insert(marker);
  }
  bool was_released(void* marker) {
    std::lock_guard<std::mutex> lock(mu);
    return released.count(marker) > 0;
  }

  std::mutex mu;
  std::set<void*> done, released;
  void* failing = nullptr;
  std::string async;
  std::atomic<int> aborts{0};
};

void* marker(int i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(0x1000 + i)); }

WatchdogOptions fast(double timeout_s, double grace_s, std::atomic<int>* exits) {
  WatchdogOptions o;
  o.timeout_s = timeout_s;
  o.poll_s = 0.01;
  o.exit_grace_s = grace_s;
  o.where = "rank 1 (cuda:1)";
  o.exit = [exits](int code) {
    EXPECT_EQ(code, 1);
    ++*exits;
  };
  return o;
}

// Waits up to 5 s for `cond`.
template <class F>
bool eventually(F cond) {
  for (int i = 0; i < 500; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return cond();
}

// The failure check() throws, which must be of `kind` (Io: a peer or the network; Internal: the engine).
std::string failure_of(CollectiveWatchdog& w, ErrorKind kind = ErrorKind::Io) {
  try {
    w.check();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    return e.what();
  }
  return "";
}

TEST(CollectiveWatchdog, CompletedCollectivesAreReleasedInOrderAndNothingFails) {
  FakeEngine engine;
  std::atomic<int> exits{0};
  {
    CollectiveWatchdog w(engine, fast(0.3, 0.1, &exits));
    w.launched(marker(1), "ncclAllReduce of 4 bytes");
    w.launched(marker(2), "ncclAllReduce of 8 bytes");
    engine.complete(marker(2));  // completes before the first: not released before it
    std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(engine.was_released(marker(2)));
    engine.complete(marker(1));
    EXPECT_TRUE(eventually([&] { return engine.was_released(marker(1)) && engine.was_released(marker(2)); }));
    std::this_thread::sleep_for(400ms);  // past the timeout: nothing is pending
    EXPECT_FALSE(w.failed());
    EXPECT_NO_THROW(w.check());
    EXPECT_EQ(w.launched_count(), 2u);
    w.launched(marker(3), "ncclBroadcast of 4 bytes");  // still pending when the watchdog stops
  }
  EXPECT_TRUE(engine.was_released(marker(3)));
  EXPECT_EQ(engine.aborts, 0);
  EXPECT_EQ(exits, 0);
}

TEST(CollectiveWatchdog, ACollectivePendingPastTheTimeoutAbortsAndIsNamed) {
  FakeEngine engine;
  std::atomic<int> exits{0};
  CollectiveWatchdog w(engine, fast(0.2, 30, &exits));
  w.launched(marker(1), "ncclAllReduce of 4 bytes");
  engine.complete(marker(1));
  w.launched(marker(2), "ncclAllReduce of 1048576 bytes");  // never completes: a rank stopped taking part
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(w.failed());  // not yet past the limit
  ASSERT_TRUE(eventually([&] { return engine.aborts.load() == 1; }));
  EXPECT_TRUE(w.failed());
  const std::string m = failure_of(w);
  EXPECT_NE(m.find("ncclAllReduce of 1048576 bytes (collective #2) has not completed after"), std::string::npos) << m;
  EXPECT_NE(m.find("on rank 1 (cuda:1)"), std::string::npos) << m;
  EXPECT_NE(m.find("--collective-timeout"), std::string::npos) << m;
  EXPECT_NE(m.find("aborted"), std::string::npos) << m;
  EXPECT_EQ(failure_of(w), m);  // every later call fails the same way
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(engine.aborts, 1);  // once
  EXPECT_EQ(exits, 0);          // the training thread took the error
}

TEST(CollectiveWatchdog, NoTimeoutWhenTheLimitIsZero) {
  FakeEngine engine;
  std::atomic<int> exits{0};
  CollectiveWatchdog w(engine, fast(0, 0.05, &exits));
  w.launched(marker(1), "ncclAllGather of 4 bytes");
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(w.failed());
  EXPECT_EQ(engine.aborts, 0);
}

// The trainer lifts the limit while rank 0 evaluates alone: collectives launched then have none, and the
// limit in force at launch is the one each collective keeps.
TEST(CollectiveWatchdog, EachCollectiveKeepsTheLimitInForceAtItsLaunch) {
  FakeEngine engine;
  std::atomic<int> exits{0};
  CollectiveWatchdog w(engine, fast(0.1, 30, &exits));
  w.set_timeout(0);
  EXPECT_EQ(w.timeout(), 0);
  w.launched(marker(1), "ncclAllGather of host values of 16 bytes");  // waits for rank 0's evaluation
  w.set_timeout(0.1);
  std::this_thread::sleep_for(400ms);
  EXPECT_FALSE(w.failed());
  engine.complete(marker(1));
  w.launched(marker(2), "ncclAllReduce of 4 bytes");  // under the 0.1 s limit again
  ASSERT_TRUE(eventually([&] { return w.failed(); }));
  EXPECT_NE(failure_of(w).find("collective #2"), std::string::npos);
  EXPECT_THROW(w.set_timeout(-1), Error);
}

TEST(CollectiveWatchdog, AnAsynchronousEngineErrorAbortsAtOnce) {
  FakeEngine engine;
  std::atomic<int> exits{0};
  CollectiveWatchdog w(engine, fast(1000, 30, &exits));
  w.launched(marker(1), "ncclAllReduce of 4 bytes");
  {
    std::lock_guard<std::mutex> lock(engine.mu);
    engine.async = "remote process exited or there was a network error";
  }
  ASSERT_TRUE(eventually([&] { return engine.aborts.load() == 1; }));
  const std::string m = failure_of(w);
  EXPECT_NE(m.find("reported an error on rank 1 (cuda:1): remote process exited"), std::string::npos) << m;
}

TEST(CollectiveWatchdog, AnEngineErrorOnACollectiveIsAFailure) {
  FakeEngine engine;
  std::atomic<int> exits{0};
  CollectiveWatchdog w(engine, fast(1000, 30, &exits));
  engine.failing = marker(7);
  w.launched(marker(7), "ncclReduceScatter of 64 bytes");
  ASSERT_TRUE(eventually([&] { return w.failed(); }));
  const std::string m = failure_of(w, ErrorKind::Internal);
  EXPECT_NE(m.find("ncclReduceScatter of 64 bytes (collective #1) failed on rank 1 (cuda:1): an illegal memory access"),
            std::string::npos)
      << m;
  EXPECT_TRUE(eventually([&] { return engine.aborts.load() == 1; }));
}

TEST(CollectiveWatchdog, AFailureNobodyTakesEndsTheProcessAfterTheGrace) {
  FakeEngine engine;
  std::atomic<int> exits{0};
  CollectiveWatchdog w(engine, fast(0.05, 0.2, &exits));
  w.launched(marker(1), "ncclAllReduce of 4 bytes");
  ASSERT_TRUE(eventually([&] { return engine.aborts.load() == 1; }));
  EXPECT_EQ(exits, 0);  // the grace has not passed yet
  ASSERT_TRUE(eventually([&] { return exits.load() == 1; }));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(exits, 1);  // once
}

TEST(CollectiveWatchdog, RejectsANegativeTimeout) {
  FakeEngine engine;
  std::atomic<int> exits{0};
  EXPECT_THROW(CollectiveWatchdog(engine, fast(-1, 1, &exits)), Error);
}

}  // namespace
}  // namespace ampforge::dist
