// The collective watchdog (watchdog.h).
#include "ampforge/dist/watchdog.h"

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "ampforge/util/error.h"
#include "ampforge/util/log.h"

namespace ampforge::dist {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

std::string collective_timeout_message(const std::string& what, uint64_t seq, double seconds, const std::string& where) {
  return fmt::format("{} (collective #{}) has not completed after {:.1f} s on {}: another rank stopped taking part "
                     "(it exited, hangs, or is busy alone for longer than the limit, e.g. writing a checkpoint), or the network "
                     "between the ranks failed (--collective-timeout sets the limit)",
                     what, seq, seconds, where);
}

void check_collective_timeout(double seconds, const char* who) {
  AF_CHECK(seconds >= 0, "{}: the collective timeout must be >= 0 seconds (0: none), got {}", who, seconds);
}

CollectiveWatchdog::CollectiveWatchdog(WatchdogBackend& backend, WatchdogOptions options)
    : backend_(backend), o_(std::move(options)) {
  check_collective_timeout(o_.timeout_s, "collective watchdog");
  AF_CHECK(o_.poll_s > 0, "watchdog poll interval must be positive, got {}", o_.poll_s);
  if (!o_.exit) o_.exit = [](int code) { std::_Exit(code); };
  thread_ = std::thread([this] { run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (const Pending& p : pending_) backend_.release(p.marker);
}

void CollectiveWatchdog::launched(void* marker, std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.push_back(Pending{marker, std::move(what), ++seq_, Clock::now(), o_.timeout_s});
}

double CollectiveWatchdog::timeout() const {
  std::lock_guard<std::mutex> lock(mu_);
  return o_.timeout_s;
}

void CollectiveWatchdog::set_timeout(double seconds) {
  check_collective_timeout(seconds, "collective watchdog");
  std::lock_guard<std::mutex> lock(mu_);
  o_.timeout_s = seconds;
}

void CollectiveWatchdog::check() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_) return;
  taken_ = true;
  if (failure_internal_) AF_THROW(Internal, "{}", *failure_);
  AF_THROW(Io, "{}", *failure_);
}

bool CollectiveWatchdog::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_.has_value();
}

uint64_t CollectiveWatchdog::launched_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seq_;
}

void CollectiveWatchdog::fail(std::string message, bool internal) {
  failure_internal_ = internal;
  failure_ = fmt::format("{}. The communicator was aborted; this rank's results since are not usable", message);
}

void CollectiveWatchdog::run() {
  backend_.attach_thread();
  std::unique_lock<std::mutex> lock(mu_);
  Clock::time_point failed_at{};
  bool exited = false;
  const auto poll = std::chrono::duration<double>(o_.poll_s);
  while (!stop_) {
    cv_.wait_for(lock, poll);
    if (stop_) break;
    if (!failure_) {
      // Collectives complete in launch order on the engine's stream: the oldest pending one is the one to watch.
      while (!pending_.empty()) {
        std::string error;
        const bool done = backend_.query(pending_.front().marker, &error);
        if (!error.empty()) {
          fail(fmt::format("{} (collective #{}) failed on {}: {}", pending_.front().what, pending_.front().seq,
                           o_.where, error),
               /*internal=*/true);
          break;
        }
        if (!done) break;
        backend_.release(pending_.front().marker);
        pending_.pop_front();
      }
      if (!failure_) {
        if (std::string e = backend_.async_error(); !e.empty())
          fail(fmt::format("the collective engine reported an error on {}: {} (another rank exited, or the network "
                           "between the ranks failed)",
                           o_.where, e));
      }
      if (!failure_ && !pending_.empty() && pending_.front().timeout_s > 0 &&
          seconds_since(pending_.front().start) > pending_.front().timeout_s) {
        const Pending& p = pending_.front();
        fail(collective_timeout_message(p.what, p.seq, seconds_since(p.start), o_.where));
      }
      if (failure_) {
        failed_at = Clock::now();
        const std::string message = *failure_;
        lock.unlock();
        // At once: the training thread may be blocked in a device wait that only the abort below ends.
        log(LogLevel::Error, "{}", message);
        backend_.abort();
        lock.lock();
      }
    } else if (!taken_ && !exited && o_.exit_grace_s >= 0 && seconds_since(failed_at) > o_.exit_grace_s) {
      exited = true;
      lock.unlock();
      log(LogLevel::Error, "{}: the training thread did not stop within {:.1f} s of the collective failure above; "
          "ending the process (exit code 1)", o_.where, o_.exit_grace_s);
      std::fflush(stderr);
      o_.exit(1);
      lock.lock();
    }
  }
}

}  // namespace ampforge::dist
