// Linked into every test binary (tests/CMakeLists.txt): a crash (SIGSEGV, SIGBUS, SIGFPE, SIGILL) prints the stack
// to stderr, then the process dies by the signal as it would have. A crash that a full ctest run or CI meets once
// then leaves more behind than ctest's "SegFault" (MetaStepLarge/resnext50_32x4d crashed 0.13 s into its test
// once in a full run, and not in 70 runs alone or under load).
//
// Frames of the test binary print as "binary(+0xOFFSET)": `addr2line -f -C -e BINARY 0xOFFSET` names the function
// and line (the binaries are PIE and not linked with -rdynamic). A static initialiser, unlike the library's
// explicit registrations: test binaries only.
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <initializer_list>

namespace {

void print_stack_and_die(int sig) {
  static const char kHeader[] = "\n*** crash: stack of the faulting thread (addr2line -f -C -e BINARY 0xOFFSET):\n";
  (void)!::write(STDERR_FILENO, kHeader, sizeof kHeader - 1);
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  ::raise(sig);  // SA_RESETHAND restored the default action: the process ends as without this handler
}

struct InstallCrashReport {
  InstallCrashReport() {
    void* warm[1];
    ::backtrace(warm, 1);  // loads libgcc's unwinder now: the first call allocates, which a handler must not
    // An alternate stack, so that a stack overflow on the main thread is reported too.
    static char alt_stack[64 * 1024];
    stack_t ss{};
    ss.ss_sp = alt_stack;
    ss.ss_size = sizeof alt_stack;
    ::sigaltstack(&ss, nullptr);
    struct sigaction sa {};
    sa.sa_handler = print_stack_and_die;
    sa.sa_flags = SA_RESETHAND | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) ::sigaction(sig, &sa, nullptr);
  }
} install_crash_report;

}  // namespace
