// `ampforge launch -n N [--spawn|--mpirun] [--] COMMAND...`: the N processes of a data-parallel job on this
// machine (dist/launch.h).
#include "ampforge/cli/commands.h"
#include "ampforge/dist/launch.h"
#include "ampforge/util/error.h"

namespace ampforge::cli {

namespace {
struct LaunchFlags {
  dist::LaunchOptions o;
  bool spawn = false, mpirun = false, quiet = false;
  std::string program;
};
}  // namespace

Command add_launch_command(CLI::App& app) {
  auto f = std::make_shared<LaunchFlags>();
  auto* sub = app.add_subcommand("launch", "Start N processes of a data-parallel job on this machine "
                                           "(ampforge launch -n 2 -- ampforge train ...)");
  sub->add_option("-n,--nproc", f->o.nproc, "Processes (ranks) to start: one per GPU, or CPU ranks")->required();
  sub->add_flag("--mpirun", f->mpirun, "Start them with mpirun (the default when mpirun is on PATH; CPU ranks need it)");
  sub->add_flag("--spawn", f->spawn,
                "Start them directly with a torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, "
                "MASTER_PORT; rank 0 serves the rendezvous store): GPU ranks on NCCL without MPI");
  sub->add_option("--master-addr", f->o.master_addr, "--spawn: MASTER_ADDR")->capture_default_str();
  sub->add_option("--master-port", f->o.master_port, "--spawn: MASTER_PORT (0: a free port)")->capture_default_str();
  sub->add_option("--grace", f->o.grace_s, "Seconds between SIGTERM and SIGKILL when stopping the others after a "
                                            "failure")->capture_default_str();
  sub->add_flag("--quiet", f->quiet, "Print nothing of the launcher's own");
  // The program, then everything after it (its options are not ours): prefix mode hands the rest to
  // remaining() in order, with or without a `--` before the program.
  sub->add_option("program", f->program, "The program every rank runs, then its arguments")->required();
  sub->prefix_command();
  sub->allow_extras();
  sub->footer("COMMAND...: the program every rank runs and its arguments, e.g. `ampforge launch -n 2 -- ampforge "
              "train --model cnn`. Stops every process when one fails and exits with the failed one's exit code (128 + signal for a "
              "signal). Exit code 2: usage error.");
  return {sub, [f, sub] {
            dist::LaunchOptions o = f->o;
            o.command = sub->remaining();
            // CLI11 keeps the `--` that came before the program at the front of remaining().
            if (!o.command.empty() && o.command.front() == "--") o.command.erase(o.command.begin());
            o.command.insert(o.command.begin(), f->program);
            AF_CHECK(!(f->spawn && f->mpirun), "launch: --spawn and --mpirun exclude each other");
            o.mode = f->spawn ? dist::LaunchMode::Spawn : f->mpirun ? dist::LaunchMode::Mpirun : dist::LaunchMode::Auto;
            o.verbose = !f->quiet;
            return dist::launch(o);
          }};
}

}  // namespace ampforge::cli
