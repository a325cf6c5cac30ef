// CollectiveWatchdog: ends a job whose ranks stopped talking, instead of letting it wait forever.
//
// A collective on a GPU is a kernel that waits for the other ranks' data. When a rank dies mid-collective,
// hangs, or the network between machines fails, the other ranks' kernels spin, and the host thread blocks at
// its next synchronisation (a loss read, a checkpoint) until the cluster's time limit: nothing fails, nothing
// is said. The launchers end a job when a rank *exits* (`ampforge launch`, mpirun, torchrun; srun with
// --kill-on-bad-exit=1), but not when one hangs or a link fails.
//
// The watchdog is a thread that polls, every `poll_s`:
//  - the completion marker of every collective launched and not yet seen complete (oldest first): one still
//    pending after `timeout_s` is a failure naming the collective, its sequence number and this rank;
//  - the engine's asynchronous error (NCCL: ncclCommGetAsyncError, set when a peer's connection broke).
// On the first failure it logs it at once (the training thread may be blocked), aborts the communicator
// (ncclCommAbort ends the spinning kernels, so blocked host waits return), and records it: check() throws it
// on the training thread, whose next collective calls check(). If the training thread has
// not taken the error within `exit_grace_s` (blocked where nothing checks), the watchdog ends the process
// with exit code 1, as PyTorch's NCCL watchdog does: after an abort the communicator is gone, the ranks'
// results are meaningless, and the launcher then stops the other ranks.
//
// The engine is behind WatchdogBackend, so the logic is tested on the CPU with a fake (watchdog_test.cpp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace ampforge::dist {

// What the watchdog needs from an engine. Called from the watchdog's thread (query, release, async_error,
// abort, attach_thread) and, for release only, from the destructor's thread.
class WatchdogBackend {
 public:
  virtual ~WatchdogBackend() = default;
  // Once, on the watchdog's thread before any other call (NCCL: make the device's context current).
  virtual void attach_thread() {}
  // true: the collective behind `marker` has completed; false: still running. An error message in *error
  // (and the return value ignored) when the engine reports a failure.
  virtual bool query(void* marker, std::string* error) = 0;
  // The marker is no longer needed (completed, or the watchdog stops).
  virtual void release(void* marker) = 0;
  // The engine's asynchronous error, or "" when there is none.
  virtual std::string async_error() = 0;
  // Ends every collective in flight; the communicator is unusable afterwards. Called at most once.
  virtual void abort() = 0;
};

struct WatchdogOptions {
  double timeout_s = 1800;   // a collective pending this long is a failure; 0: no limit (set_timeout changes it)
  double poll_s = 0.2;
  double exit_grace_s = 60;  // after a failure, the time the training thread has to take it; < 0: never exit
  std::string where;         // "rank 1 (cuda:1)": who reports, in every message
  std::function<void(int)> exit;  // how the process ends (tests replace it); default std::_Exit
};

// The failure of a collective still pending after its limit, in the words both backends use ("ncclAllReduce of
// 4096 bytes (collective #12) has not completed after 1800.2 s on rank 1 (cuda:1): another rank stopped ...").
std::string collective_timeout_message(const std::string& what, uint64_t seq, double seconds, const std::string& where);
// Throws InvalidArgument unless `seconds` is a valid collective limit (>= 0; 0: none); `who` names the caller.
void check_collective_timeout(double seconds, const char* who);

class CollectiveWatchdog {
 public:
  // Starts the thread. `backend` must outlive the watchdog.
  CollectiveWatchdog(WatchdogBackend& backend, WatchdogOptions options);
  // Stops the thread and releases the markers still held (no failure is reported for them).
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // A collective was launched; `marker` completes with it (the watchdog owns it from now on: it releases it).
  // `what` names it in messages ("ncclAllReduce of 4194304 bytes").
  void launched(void* marker, std::string what);
  // Throws the failure once there is one (and from then on, every time): Error(Io) for a timeout or the engine's
  // asynchronous error (a peer or the network), Error(Internal) for an error the engine reports on a collective.
  void check();
  bool failed() const;
  // Collectives launched so far (the sequence number of the last one).
  uint64_t launched_count() const;
  // The limit of the collectives launched from now on (those launched before keep theirs); 0: none.
  double timeout() const;
  void set_timeout(double seconds);

 private:
  struct Pending {
    void* marker;
    std::string what;
    uint64_t seq;
    std::chrono::steady_clock::time_point start;
    double timeout_s;  // 0: none
  };
  void run();
  void fail(std::string message, bool internal = false);  // with mu_ held

  WatchdogBackend& backend_;
  WatchdogOptions o_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  uint64_t seq_ = 0;
  std::optional<std::string> failure_;
  bool failure_internal_ = false;
  bool taken_ = false;  // check() has thrown the failure
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ampforge::dist
