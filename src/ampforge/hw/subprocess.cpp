#include "ampforge/hw/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "ampforge/util/env.h"
#include "ampforge/util/signals.h"
#include "ampforge/util/socket.h"
#include "ampforge/util/timer.h"

extern char** environ;

namespace ampforge::hw {

namespace {
constexpr size_t kMaxOutput = 1 << 20;
double now_s() { return static_cast<double>(now_ns()) * 1e-9; }
}  // namespace

Subprocess::Subprocess(const std::vector<std::string>& argv, bool merge_stderr, bool interactive) {
  start_s_ = now_s();
  if (argv.empty()) {
    result_.error = "no program given";
    return;
  }
  const std::string exe = find_program(argv[0]);
  if (exe.empty()) {
    result_.error = argv[0] + ": not found in PATH";
    return;
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    result_.error = std::string("pipe: ") + std::strerror(errno);
    return;
  }
  // Interactive stdin is a socket pair, not a pipe: send(MSG_NOSIGNAL) to a program that died returns EPIPE
  // instead of raising SIGPIPE in this process.
  int in[2] = {-1, -1};
  if (interactive && ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) != 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    result_.error = std::string("socketpair: ") + std::strerror(errno);
    return;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (interactive)
    posix_spawn_file_actions_adddup2(&actions, in[1], 0);
  else
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  if (merge_stderr)
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  else
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  set_child_spawn_attributes(attr);  // its own group, so a timeout kills its children too
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, exe.c_str(), &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (in[1] >= 0) ::close(in[1]);
  if (rc != 0) {
    ::close(fds[0]);
    if (in[0] >= 0) ::close(in[0]);
    result_.error = exe + ": " + std::strerror(rc);
    return;
  }
  pid_ = pid;
  fd_ = fds[0];
  in_fd_ = in[0];
  result_.started = true;
}

bool Subprocess::write_line(const std::string& line) {
  return in_fd_ >= 0 && send_all(in_fd_, line + "\n");
}

Subprocess::Read Subprocess::read_more(std::string& into, double deadline) {
  char buf[4096];
  while (fd_ >= 0) {
    const double left = deadline - now_s();
    if (left <= 0) {
      result_.timed_out = true;
      return Read::Timeout;
    }
    pollfd p{fd_, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (n <= 0) continue;  // EINTR, or poll's rounding before the deadline
    const ssize_t got = ::read(fd_, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // EOF: the program closed stdout (normally: it exited)
    if (into.size() < kMaxOutput) into.append(buf, static_cast<size_t>(got));
    return Read::Data;
  }
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  return Read::Eof;
}

std::optional<std::string> Subprocess::read_line(double timeout_s) {
  const double deadline = now_s() + timeout_s;
  while (true) {
    if (const size_t nl = pending_.find('\n'); nl != std::string::npos) {
      std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      return line;
    }
    if (read_more(pending_, deadline) != Read::Data) return std::nullopt;  // wait() collects the exit status
  }
}

Subprocess::~Subprocess() {
  if (in_fd_ >= 0) ::close(in_fd_);
  if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  if (fd_ >= 0) ::close(fd_);
}

SubprocessResult Subprocess::wait(double timeout_s) {
  if (in_fd_ >= 0) {  // end of input: an interactive program finishes
    ::close(in_fd_);
    in_fd_ = -1;
  }
  if (pid_ <= 0) return result_;
  result_.out = std::move(pending_);
  pending_.clear();
  // Output until EOF or the deadline (none left to wait for when a read_line already timed out).
  while (!result_.timed_out && read_more(result_.out, start_s_ + timeout_s) == Read::Data) {
  }
  int status = 0;
  if (!result_.timed_out) {
    // stdout closed; the program may still run (it closed stdout itself). Give it until the deadline.
    while (true) {
      pid_t w = ::waitpid(pid_, &status, WNOHANG);
      if (w == pid_) break;
      if (w < 0 && errno != EINTR) break;
      if (now_s() > start_s_ + timeout_s) {
        result_.timed_out = true;
        break;
      }
      ::usleep(2000);
    }
  }
  if (result_.timed_out) {
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    result_.error = "timed out";
  } else if (WIFEXITED(status)) {
    result_.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result_.signal = WTERMSIG(status);
  }
  pid_ = -1;
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  return result_;
}

SubprocessResult run_subprocess(const std::vector<std::string>& argv, double timeout_s, bool merge_stderr) {
  Subprocess p(argv, merge_stderr);
  return p.wait(timeout_s);
}

}  // namespace ampforge::hw
