#include "ampforge/dist/launch.h"

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "ampforge/dist/mpi_communicator.h"
#include "ampforge/util/env.h"
#include "ampforge/util/error.h"
#include "ampforge/util/signals.h"

extern char** environ;

namespace ampforge::dist {

namespace {

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal.store(sig); }

// Children are reaped in the SIGCHLD handler, the moment they exit, so the order of the records is the order
// of the exits: the first rank to fail is the one named, not one that failed because of it a moment later.
constexpr int kMaxExits = 8192;
pid_t g_exit_pid[kMaxExits];
int g_exit_status[kMaxExits];
std::atomic<int> g_exits{0};
void on_child(int) {
  const int saved = errno;
  int st = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &st, WNOHANG)) > 0) {
    const int i = g_exits.load();
    if (i >= kMaxExits) break;
    g_exit_pid[i] = pid;
    g_exit_status[i] = st;
    g_exits.store(i + 1);
  }
  errno = saved;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A free TCP port on this host (bound to port 0 and released: rank 0's store binds it moments later).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  AF_CHECK(fd >= 0, "launch: cannot create a socket: {}", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  AF_CHECK(ok, "launch: cannot find a free port: {}", std::strerror(errno));
  return ntohs(a.sin_port);
}

struct Proc {
  std::string name;  // "rank 1" | "mpirun"
  pid_t pid = -1;
  bool running = false;
};

pid_t start(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group: stopping a rank stops what it started too (a shell wrapper's children).
  set_child_spawn_attributes(attr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], nullptr, &attr, args.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  AF_CHECK(rc == 0, "launch: cannot start '{}': {}", argv[0], std::strerror(rc));
  return pid;
}

// Catches SIGCHLD (reaping), SIGINT and SIGTERM while a job runs; restores the old handlers afterwards.
class JobSignals {
 public:
  JobSignals() {
    g_signal.store(0);
    g_exits.store(0);
    struct sigaction sa{};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sa.sa_handler = on_child;
    sigaction(SIGCHLD, &sa, &old_chld_);
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~JobSignals() {
    sigaction(SIGCHLD, &old_chld_, nullptr);
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  JobSignals(const JobSignals&) = delete;
  JobSignals& operator=(const JobSignals&) = delete;

 private:
  struct sigaction old_chld_{}, old_int_{}, old_term_{};
};

// Waits for every process; on the first failure stops the others. Returns the launcher's exit code. The first
// Ctrl-C sends `gentle` instead: the ranks stop after their current step and rank 0 writes the checkpoint, so no
// SIGKILL follows; another signal is forwarded as it is, and SIGKILL follows it after grace_s.
int supervise(std::vector<Proc>& procs, double grace_s, bool verbose, int gentle) {
  auto signal_all = [&](int sig) {
    for (const Proc& p : procs)
      if (p.running) ::kill(-p.pid, sig);
  };
  int code = 0, forwarded = 0, seen = 0;
  bool failed = false;
  double kill_at = -1;
  size_t alive = procs.size();
  while (alive > 0) {
    for (; seen < g_exits.load(); ++seen) {
      const int st = g_exit_status[seen];
      auto it = std::find_if(procs.begin(), procs.end(), [&](const Proc& p) { return p.pid == g_exit_pid[seen]; });
      if (it == procs.end() || !it->running) continue;
      it->running = false;
      --alive;
      const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (ok || failed || forwarded) continue;
      failed = true;
      code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (verbose)
        std::fprintf(stderr, "ampforge launch: %s (pid %d) %s; stopping the other %zu process%s\n", it->name.c_str(),
                     static_cast<int>(it->pid),
                     WIFEXITED(st) ? fmt::format("exited with code {}", WEXITSTATUS(st)).c_str()
                                   : fmt::format("was killed by signal {} ({})", WTERMSIG(st),
                                                 strsignal(WTERMSIG(st))).c_str(),
                     alive, alive == 1 ? "" : "es");
      signal_all(SIGTERM);
      kill_at = now_s() + grace_s;
    }
    if (const int sig = g_signal.exchange(0); sig != 0) {
      const bool first_ctrl_c = sig == SIGINT && forwarded == 0;
      if (first_ctrl_c && verbose)
        std::fprintf(stderr,
                     "ampforge launch: stopping the job after the current step (Ctrl-C again to stop at once)\n");
      forwarded = sig;
      signal_all(first_ctrl_c ? gentle : sig);
      if (!first_ctrl_c && kill_at < 0) kill_at = now_s() + grace_s;
    }
    if (kill_at >= 0 && now_s() >= kill_at && alive > 0) {
      signal_all(SIGKILL);
      kill_at = now_s() + 3600;
    }
    if (alive > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (failed) return code;
  return forwarded ? 128 + forwarded : 0;
}

bool is_launch_variable(const std::string& e) {
  for (const char* v : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=",
                        "GROUP_RANK="})
    if (e.rfind(v, 0) == 0) return true;
  return false;
}

}  // namespace

std::string find_mpirun() { return mpi_built() ? find_program("mpirun") : std::string(); }

std::vector<std::string> mpirun_command(const std::string& mpirun, const LaunchOptions& o) {
  // --oversubscribe: more ranks than cores is fine for CPU ranks sharing a machine (each gets its share of
  // the threads, train/recipe.cpp); --bind-to none: ampforge sizes its own thread pools.
  std::vector<std::string> argv{mpirun, "-n", std::to_string(o.nproc), "--oversubscribe", "--bind-to", "none"};
  if (::geteuid() == 0) argv.push_back("--allow-run-as-root");  // Open MPI refuses root without it
  argv.insert(argv.end(), o.command.begin(), o.command.end());
  return argv;
}

int launch(const LaunchOptions& o) {
  AF_CHECK(o.nproc >= 1 && o.nproc <= 4096, "launch: -n must be in [1, 4096], got {}", o.nproc);
  AF_CHECK(!o.command.empty(), "launch: no command to run (ampforge launch -n N -- ampforge train ...)");
  AF_CHECK(o.grace_s >= 0, "launch: --grace must be >= 0, got {}", o.grace_s);
  AF_CHECK(o.master_port >= 0 && o.master_port <= 65535, "launch: --master-port must be in [0, 65535], got {}",
           o.master_port);
  // Checked here, before any rank starts: mpirun would report a missing program in a page of its own text and exit
  // with a code of its own (131-134), which `launch` passes on as if the program had failed.
  check_program(o.command[0], "launch");
  std::string mpirun;
  if (o.mode != LaunchMode::Spawn) {
    mpirun = find_mpirun();
    AF_CHECK(!mpirun.empty() || o.mode == LaunchMode::Auto, "launch: --mpirun asked for, but {}",
             mpi_built() ? "mpirun is not on PATH (apt-get install openmpi-bin)"
                         : "this ampforge was built without MPI");
  }
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e)
    if (!is_launch_variable(*e)) env.emplace_back(*e);
  std::vector<Proc> procs;
  JobSignals signals;  // before the first child starts, so that no exit is missed
  if (!mpirun.empty()) {
    const std::vector<std::string> argv = mpirun_command(mpirun, o);
    if (o.verbose) {
      std::string line;
      for (const auto& a : argv) line += (line.empty() ? "" : " ") + a;
      std::fprintf(stderr, "ampforge launch: %s\n", line.c_str());
    }
    procs.push_back({"mpirun", start(argv, env), true});
    // mpirun aborts the job on SIGINT and forwards SIGUSR1 to every rank.
    return supervise(procs, o.grace_s, o.verbose, SIGUSR1);
  }
  const int port = o.master_port > 0 ? o.master_port : free_port();
  if (o.verbose)
    std::fprintf(stderr, "ampforge launch: %d processes, MASTER_ADDR=%s MASTER_PORT=%d\n", o.nproc,
                 o.master_addr.c_str(), port);
  for (int r = 0; r < o.nproc; ++r) {
    std::vector<std::string> e = env;
    e.push_back(fmt::format("RANK={}", r));
    e.push_back(fmt::format("LOCAL_RANK={}", r));
    e.push_back(fmt::format("GROUP_RANK=0"));
    e.push_back(fmt::format("WORLD_SIZE={}", o.nproc));
    e.push_back(fmt::format("LOCAL_WORLD_SIZE={}", o.nproc));
    e.push_back("MASTER_ADDR=" + o.master_addr);
    e.push_back(fmt::format("MASTER_PORT={}", port));
    try {
      procs.push_back({fmt::format("rank {}", r), start(o.command, e), true});
    } catch (...) {
      for (const Proc& p : procs) ::kill(-p.pid, SIGKILL);
      while (g_exits.load() < static_cast<int>(procs.size())) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      throw;
    }
  }
  return supervise(procs, o.grace_s, o.verbose, SIGINT);
}

}  // namespace ampforge::dist
