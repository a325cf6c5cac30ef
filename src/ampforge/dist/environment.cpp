#include "ampforge/dist/environment.h"

#include <algorithm>
#include <charconv>
#include <memory>
#include <optional>

#include "ampforge/dist/mpi_communicator.h"
#include "ampforge/dist/nccl_communicator.h"
#include "ampforge/dist/store.h"
#include "ampforge/util/env.h"
#include "ampforge/util/error.h"

namespace ampforge::dist {

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::None: return "none";
    case Launcher::Mpi: return "mpi";
    case Launcher::Env: return "env";
  }
  return "?";
}

namespace {

// An integer environment variable: nullopt when unset; throws when set but not an integer in [lo, hi].
std::optional<int> env_int_in(const char* name, int lo, int hi, const char* what) {
  auto v = env_get(name);
  if (!v) return std::nullopt;
  int x = 0;
  const char* b = v->data();
  const char* e = b + v->size();
  auto [p, ec] = std::from_chars(b, e, x);
  AF_CHECK(!v->empty() && ec == std::errc() && p == e && x >= lo && x <= hi, "{}={}: {} must be an integer in [{}, {}]",
           name, *v, what, lo, hi);
  return x;
}

bool has(const char* name) { return env_get(name).has_value(); }

}  // namespace

WorldInfo detect_world() {
  WorldInfo w;
  constexpr int kMax = 1 << 20;
  // MPI launchers. Rank/size are read here for messages; MPI itself is asked at init.
  struct MpiVars {
    const char *rank, *size;
  };
  for (const MpiVars v : {MpiVars{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, MpiVars{"PMIX_RANK", nullptr},
                          MpiVars{"PMI_RANK", "PMI_SIZE"}}) {
    if (!has(v.rank)) continue;
    w.launcher = Launcher::Mpi;
    w.rank = *env_int_in(v.rank, 0, kMax, "the MPI rank");
    if (v.size && has(v.size)) w.size = *env_int_in(v.size, 1, kMax, "the MPI world size");
    w.local_rank = env_int_in("OMPI_COMM_WORLD_LOCAL_RANK", 0, kMax, "the local rank").value_or(0);
    w.local_size = env_int_in("OMPI_COMM_WORLD_LOCAL_SIZE", 1, kMax, "the local size").value_or(1);
    return w;
  }
  // torchrun-style, or Slurm's variables in their place.
  const bool torchrun = has("RANK") || has("WORLD_SIZE");
  const bool slurm = !torchrun && has("MASTER_ADDR") && has("SLURM_PROCID") && has("SLURM_NTASKS");
  if (!torchrun && !slurm) return w;
  const char* rank_var = torchrun ? "RANK" : "SLURM_PROCID";
  const char* size_var = torchrun ? "WORLD_SIZE" : "SLURM_NTASKS";
  const char* local_var = torchrun ? "LOCAL_RANK" : "SLURM_LOCALID";
  AF_CHECK(has(size_var), "{} is set but {} is not: a torchrun-style launcher sets RANK, WORLD_SIZE, MASTER_ADDR and "
           "MASTER_PORT together", rank_var, size_var);
  AF_CHECK(has(rank_var), "{} is set but {} is not: a torchrun-style launcher sets RANK, WORLD_SIZE, MASTER_ADDR and "
           "MASTER_PORT together", size_var, rank_var);
  w.launcher = Launcher::Env;
  w.size = *env_int_in(size_var, 1, kMax, "the world size");
  w.rank = *env_int_in(rank_var, 0, w.size - 1, "the rank (0 <= rank < world size)");
  w.local_rank = env_int_in(local_var, 0, kMax, "the local rank").value_or(w.rank);
  w.local_size = env_int_in(torchrun ? "LOCAL_WORLD_SIZE" : "SLURM_NTASKS_PER_NODE", 1, kMax, "the local world size")
                     .value_or(w.size);
  w.master_addr = env_get("MASTER_ADDR").value_or("");
  AF_CHECK(!w.master_addr.empty() || w.size == 1, "MASTER_ADDR is not set: with WORLD_SIZE={} every rank needs the "
           "address of rank 0's host (MASTER_ADDR) and a free port there (MASTER_PORT)", w.size);
  if (w.master_addr.empty()) w.master_addr = "127.0.0.1";
  w.master_port = env_int_in("MASTER_PORT", 1, 65535, "the port of rank 0's store").value_or(0);
  AF_CHECK(w.master_port > 0 || w.size == 1, "MASTER_PORT is not set: with WORLD_SIZE={} rank 0 serves the "
           "rendezvous store on MASTER_ADDR:MASTER_PORT (29500 is the usual choice)", w.size);
  return w;
}

CommunicatorPtr init_process_group(const WorldInfo& world, const InitOptions& o) {
  AF_CHECK(world.distributed(), "init_process_group: no launcher environment (mpirun, srun, torchrun or `ampforge "
           "launch`) was found");
  AF_CHECK(o.device.is_cpu() || o.device.is_cuda(), "data parallel runs on cpu or cuda devices, not {}", o.device.str());
  if (world.launcher == Launcher::Mpi) {
    AF_CHECK(mpi_built(), "this process was started by an MPI launcher (rank {} of {}), but this ampforge was built "
             "without MPI: install libopenmpi-dev (scripts/setup) and rebuild, or start the ranks with torchrun / "
             "`ampforge launch --spawn` (GPUs only)", world.rank, world.size);
    if (o.device.is_cpu()) return make_mpi_communicator(o.collective_timeout_s);
    const auto [rank, size] = mpi_world();
    NcclOptions no;
    no.rank = rank;
    no.size = size;
    no.device = o.device.index;
    no.compute_stream = o.compute_stream;
    no.collective_timeout_s = o.collective_timeout_s;
    no.share_id = [](NcclUniqueId& id) { mpi_broadcast_bytes(id.data(), id.size(), 0); };
    return make_nccl_communicator(no);
  }
  // torchrun-style: rank 0 serves the store; everyone meets there first (this is where a missing or
  // mis-configured rank is named).
  if (o.device.is_cpu()) {
    AF_CHECK(world.size == 1,
             "rank {} of {} runs on the CPU, and CPU ranks exchange gradients over MPI: start them with an MPI "
             "launcher (`ampforge launch -n {} -- ...` uses mpirun for CPU ranks; or `mpirun -n {} ...`, `srun "
             "--mpi=pmix ...`) instead of a torchrun-style environment, which ampforge uses for NCCL (GPU) ranks",
             world.rank, world.size, world.size, world.size);
    AF_CHECK(mpi_built(), "rank {} of {} runs on the CPU, which needs MPI, and this ampforge was built without it: "
             "install libopenmpi-dev (scripts/setup) and rebuild", world.rank, world.size);
    // A world of one: MPI as a singleton (no launcher needed), so the data-parallel code path still runs.
    return make_mpi_communicator(o.collective_timeout_s);
  }
  StoreOptions so;
  so.host = world.master_addr;
  so.port = world.master_port;
  so.rank = world.rank;
  so.world_size = world.size;
  so.is_server = world.rank == 0;
  so.timeout_s = o.timeout_s;
  if (world.size == 1 && so.port == 0) so.host = "127.0.0.1";  // a world of one: any free port
  auto store = std::make_shared<TcpStore>(so);
  store->barrier("ampforge/start");
  NcclOptions no;
  no.rank = world.rank;
  no.size = world.size;
  no.device = o.device.index;
  no.compute_stream = o.compute_stream;
  no.collective_timeout_s = o.collective_timeout_s;
  no.keep_alive = store;
  no.share_id = [store, rank = world.rank](NcclUniqueId& id) {
    if (rank == 0) store->set("ampforge/nccl_id", std::string(id.data(), id.size()));
    const std::string v = store->get("ampforge/nccl_id");
    AF_ASSERT(v.size() == id.size(), "store: the NCCL id has {} bytes, expected {}", v.size(), id.size());
    std::copy(v.begin(), v.end(), id.begin());
  };
  CommunicatorPtr comm = make_nccl_communicator(no);
  store->barrier("ampforge/nccl_ready");
  return comm;
}

void abort_job(int exit_code) {
  if (mpi_initialized()) {
    if (mpi_world().second > 1) mpi_abort(exit_code);
  }
}

}  // namespace ampforge::dist
