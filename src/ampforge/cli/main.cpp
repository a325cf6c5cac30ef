// ampforge: the command-line tool. One file per subcommand (cli/<name>.cpp); this file wires them up.
// Exit codes: 0 success, 1 a check failed, 2 usage or input error.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include <CLI/CLI.hpp>

#include "ampforge/cli/commands.h"
#include "ampforge/cli/option_schema.h"
#include "ampforge/dist/environment.h"
#include "ampforge/util/build_info.h"
#include "ampforge/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"ampforge: fast mixed-precision training, with the tools that make a GPU fast in practice"};
  app.set_version_flag("--version", std::string("ampforge ") + AMPFORGE_VERSION_STRING + " (" + AMPFORGE_BUILD_TYPE +
                                        ", " + AMPFORGE_CXX_COMPILER + ")");
  app.require_subcommand(1);
  ampforge::cli::CommandList commands = ampforge::cli::register_commands(app);
  // Hidden: every subcommand's options as JSON (cli/option_schema.h), for the option sweep and completions.
  if (argc == 2 && std::strcmp(argv[1], "--cli-schema") == 0) {
    std::printf("%s\n", ampforge::cli::option_schema_json(app).c_str());
    return 0;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // A rank of a data-parallel job that fails stops the whole job (MPI_Abort), so the others do not wait for it
  // forever in a collective.
  auto fail = [](const char* what, int code) {
    std::fprintf(stderr, "ampforge: error: %s\n", what);
    std::fflush(stderr);
    ampforge::dist::abort_job(code);
    return code;
  };
  try {
    for (auto& c : commands)
      if (c.sub->parsed()) return c.run();
  } catch (const ampforge::Error& e) {
    return fail(e.what(), e.kind() == ampforge::ErrorKind::Internal ? 3 : 2);
  } catch (const std::bad_alloc&) {
    // A request larger than the host can hold (sizes from the command line): the user's to change, not a bug.
    return fail("out of host memory: the sizes asked for need more memory than this machine (or its limit) gives; "
                "lower them (batch, image size, data set size)", 2);
  } catch (const std::exception& e) {
    return fail(e.what(), 3);
  }
  return 0;
}
