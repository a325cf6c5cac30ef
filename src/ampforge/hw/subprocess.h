// Running a helper program with a deadline: doctor asks python3 for framework versions, and a broken
// Python (an import that hangs on a dead NFS mount, a CUDA init that never returns) must not hang doctor.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ampforge::hw {

struct SubprocessResult {
  bool started = false;    // false: the program could not be run (error says why)
  bool timed_out = false;  // killed (with its whole process group) at the deadline
  int exit_code = -1;      // when it exited normally
  int signal = 0;          // when a signal ended it
  std::string out;         // stdout (and, when merged, stderr), at most 1 MiB
  std::string error;
};

// Starts argv[0] (searched in PATH) in its own process group with stdin from /dev/null, or, when `interactive`,
// from a connection this object writes lines to (a conversation: `ampforge bench --interleave` asks its PyTorch
// peer for one step at a time).
class Subprocess {
 public:
  Subprocess(const std::vector<std::string>& argv, bool merge_stderr, bool interactive = false);
  ~Subprocess();  // kills the process group if still running
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  bool started() const { return result_.started; }
  const std::string& error() const { return result_.error; }
  // Interactive only: sends `line` and a newline to the program's stdin; false when it is gone (never SIGPIPE).
  bool write_line(const std::string& line);
  // The program's next stdout line (without the newline), waiting at most `timeout_s`; nullopt at end of output
  // or timeout (timed_out() says which).
  std::optional<std::string> read_line(double timeout_s);
  bool timed_out() const { return result_.timed_out; }
  // Collects output until the program exits or `timeout_s` (counted from construction) passes. Interactive: its
  // stdin is closed first (end of input), and output read_line did not return comes first in `out`.
  SubprocessResult wait(double timeout_s);

 private:
  enum class Read { Data, Eof, Timeout };
  // Waits for the program's stdout until `deadline` (seconds on the steady clock of now_ns) and appends one read to
  // `into` (at most 1 MiB in all); at EOF closes it, at the deadline marks the result timed out.
  Read read_more(std::string& into, double deadline);

  int pid_ = -1;
  int fd_ = -1;
  int in_fd_ = -1;        // interactive: our end of the program's stdin
  std::string pending_;  // read but not yet returned by read_line
  double start_s_ = 0;
  SubprocessResult result_;
};

SubprocessResult run_subprocess(const std::vector<std::string>& argv, double timeout_s, bool merge_stderr = false);

}  // namespace ampforge::hw
