// `ampforge bench`: the brief's FP32-vs-FP16 table on this machine — full training steps of the brief's
// models at each precision (train/benchmark.h), with PyTorch running the same models, batches and
// precisions in its own process beside each cell (bench/peer/torch_bench_peer.py). Methodology:
// docs/BENCH.md.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ampforge/backends/cpu/blas_kernels.h"
#include "ampforge/backends/cpu/conv_onednn.h"
#include "ampforge/backends/cpu/matmul_onednn.h"
#include "ampforge/cli/bench_collective.h"
#include "ampforge/cli/bench_report.h"
#include "ampforge/cli/commands.h"
#include "ampforge/core/runtime.h"
#include "ampforge/tasks/registry.h"
#include "ampforge/util/thread_pool.h"
#include "ampforge/hw/host_probe.h"
#include "ampforge/hw/subprocess.h"
#include "ampforge/memory/caching_allocator.h"
#include "ampforge/memory/global.h"
#include "ampforge/models/registry.h"
#include "ampforge/profiler/report.h"
#include "ampforge/memory/fit.h"
#include "ampforge/memory/stats.h"
#include "ampforge/train/benchmark.h"
#include "ampforge/train/fit_probe.h"
#include "ampforge/util/build_info.h"
#include "ampforge/util/env.h"
#include "ampforge/util/error.h"
#include "ampforge/util/file.h"
#include "ampforge/util/signals.h"
#include "ampforge/util/timer.h"

namespace ampforge::cli {

namespace {

namespace fs = std::filesystem;

// The brief's rows, in its order.
const std::vector<std::string> kBriefModels = {"resnet50", "bert-base", "yolov8n", "yolov8s"};

// Sizes per model: the brief's on a GPU (or with --full); on a CPU reduced ones, so that the default table
// (four models x two precisions, ampforge and both peer columns) finishes in minutes on two cores.
struct Sizes {
  int64_t batch, size;  // size: the square image side, or the sequence length for sequence models
};
Sizes default_sizes(const std::string& model, bool seq, bool full) {
  if (model == "resnet50") return full ? Sizes{256, 224} : Sizes{8, 128};
  if (model == "bert-base") return full ? Sizes{64, 128} : Sizes{4, 64};
  if (model == "yolov8n" || model == "yolov8s") return full ? Sizes{16, 640} : Sizes{2, 320};
  return seq ? Sizes{full ? 64 : 8, full ? 128 : 64} : Sizes{full ? 256 : 64, 0};
}

struct BenchFlags {
  std::string models, precisions, device = "cpu", batches, peer = "auto", markdown, svg, optimizer = "sgd";
  std::string budget;    // --budget, with --max-batch
  bool max_batch = false;
  bool recompute = false;
  bool profile = false;
  int rounds = 1;  // --rounds
  int64_t image_size = 0, seq_len = 0;
  int warmup = -1, steps = -1, threads = 0;
  bool channels_last = false, nchw = false, cuda_graphs = false, json = false, full = false, collective = false;
  bool interleave = false;  // --interleave
  bool no_compile = false;  // --no-compile: no torch.compile column
  double peer_timeout = 1800;
  double peer_seconds = 20;  // --peer-seconds: CPU, the peer's timed steps stop after this many seconds of them
  CollectiveBenchOptions coll;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::map<std::string, int64_t> parse_batches(const std::string& s) {
  std::map<std::string, int64_t> out;
  for (const std::string& item : split(s)) {
    const size_t eq = item.find('=');
    AF_CHECK(eq != std::string::npos && eq > 0, "--batch takes MODEL=N[,MODEL=N...], got '{}'", item);
    int64_t n = 0;
    try {
      size_t used = 0;
      n = std::stoll(item.substr(eq + 1), &used);
      AF_CHECK(used == item.size() - eq - 1, "bad number");
    } catch (const std::exception&) {
      AF_THROW(InvalidArgument, "--batch {}: '{}' is not a number", item, item.substr(eq + 1));
    }
    AF_CHECK(n >= 1, "--batch {}: the batch must be >= 1", item);
    out[item.substr(0, eq)] = n;
  }
  return out;
}

// The directory of the peer script: $AMPFORGE_PEER_DIR, the installation's share/ampforge/peer beside the
// executable, or this source tree's bench/peer.
std::string peer_script() {
  const std::string name = "torch_bench_peer.py";
  if (const char* env = std::getenv("AMPFORGE_PEER_DIR")) return (fs::path(env) / name).string();
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path().parent_path() / AMPFORGE_INSTALL_DATADIR / "ampforge" / "peer" / name;
    if (fs::exists(installed)) return installed.string();
  }
  return (fs::path(AMPFORGE_SOURCE_DIR) / "bench" / "peer" / name).string();
}

// The interpreter for --peer auto: $AMPFORGE_PEER_PYTHON, the source tree's .venv-peer (today's PyTorch with
// transformers and Ultralytics: `scripts/setup --peer`), Debian's /usr/bin/python3 (PyTorch 1.13), or python3 in
// PATH — the first that imports torch. Empty when none does.
std::string find_peer_python(const std::string& flag, std::string* torch_version, std::string* why) {
  std::vector<std::string> candidates;
  if (flag == "auto") {
    if (const char* env = std::getenv("AMPFORGE_PEER_PYTHON")) candidates.push_back(env);
    if (const fs::path venv = fs::path(AMPFORGE_SOURCE_DIR) / ".venv-peer" / "bin" / "python"; fs::exists(venv))
      candidates.push_back(venv.string());
    candidates.push_back("/usr/bin/python3");
    candidates.push_back("python3");
  } else {
    candidates.push_back(flag);
  }
  for (const std::string& py : candidates) {
    const hw::SubprocessResult r = hw::run_subprocess({py, "-c", "import torch; print(torch.__version__)"}, 120);
    if (r.started && !r.timed_out && r.exit_code == 0 && !r.out.empty()) {
      *torch_version = r.out.substr(0, r.out.find_first_of("\r\n"));
      return py;
    }
    *why += fmt::format("{}: {}; ", py, !r.started ? r.error : r.timed_out ? "timed out" : "no torch");
  }
  return "";
}

std::vector<std::string> peer_argv(const std::string& python, const std::string& model, const std::string& precision,
                                   int64_t batch, int64_t size, bool seq, const BenchFlags& f, int warmup, int steps,
                                   int threads) {
  std::vector<std::string> argv = {python, peer_script(), "--model", model, "--precision", precision,
                                   "--batch", std::to_string(batch), "--steps", std::to_string(steps),
                                   "--warmup", std::to_string(warmup), "--device", f.device,
                                   "--threads", std::to_string(threads), "--optimizer", f.optimizer};
  if (size > 0) {
    argv.push_back(seq ? "--seq-len" : "--image-size");
    argv.push_back(std::to_string(size));
  }
  // PyTorch's 16-bit CPU autocast without AVX512_BF16 takes up to minutes per step: one long step is a measurement
  // with little noise, and the default table stays within minutes. CUDA steps are short and timed as a whole.
  if (f.device == "cpu" && f.peer_seconds > 0) {
    argv.push_back("--max-seconds");
    argv.push_back(fmt::format("{}", f.peer_seconds));
  }
  if (f.profile) argv.push_back("--profile");  // torch.profiler over one more step, beside ours
  return argv;
}

// The peer's result object (its best memory format) as a BenchSide, or what went wrong.
BenchSide parse_peer_result(const hw::SubprocessResult& r, const std::string& script, int64_t batch,
                            const BenchFlags& f, std::string* gpu_name) {
  BenchSide s;
  if (!r.started || r.timed_out || r.exit_code != 0) {
    s.error = !r.started ? "could not start: " + r.error
              : r.timed_out ? fmt::format("timed out after {:.0f} s", f.peer_timeout)
                            : fmt::format("the peer script exited with code {} (run {} by hand)", r.exit_code, script);
    return s;
  }
  // The result object is the script's last line (a library may have printed to stdout before it). A missing or
  // mistyped field is a failed peer cell, never an exception out of the bench (the cells measured so far would
  // be lost with it).
  std::string line = r.out;
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) line.pop_back();
  if (const size_t nl = line.find_last_of('\n'); nl != std::string::npos) line.erase(0, nl + 1);
  try {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("gpu") && gpu_name->empty()) *gpu_name = j.at("gpu").get<std::string>();
    if (j.contains("error")) {
      s.error = j.at("error").get<std::string>();
      return s;
    }
    const std::string best = j.at("best").get<std::string>();
    const auto& b = j.at("results").at(best);
    s.memory_format = best;
    if (j.contains("skipped"))
      for (const auto& [fmt_name, why] : j.at("skipped").items())
        s.skipped += (s.skipped.empty() ? "" : "; ") + fmt_name + " " + why.get<std::string>();
    s.step_seconds = b.at("seconds").get<std::vector<double>>();
    s.median_seconds = b.at("median").get<double>();
    s.samples_per_sec = b.at("samples_per_sec").get<double>();
    s.mean_samples_per_sec = static_cast<double>(batch) / b.at("mean").get<double>();
    s.parameters = b.at("parameters").get<int64_t>();
    s.last_loss = b.at("last_loss").get<double>();
    if (b.contains("peak_allocated_bytes")) s.peak_allocated_bytes = b.at("peak_allocated_bytes").get<int64_t>();
    if (b.contains("peak_reserved_bytes")) s.peak_reserved_bytes = b.at("peak_reserved_bytes").get<int64_t>();
    if (b.contains("profile")) s.profile = b.at("profile");
  } catch (const std::exception& e) {
    s = BenchSide{};
    s.error = fmt::format("unreadable peer output ({})", e.what());
    return s;
  }
  s.ok = true;
  s.timer = f.device == "cpu" ? "host clock" : "cuda events";
  return s;
}

BenchSide peer_cell(const std::string& python, const std::string& model, const std::string& precision, int64_t batch,
                    int64_t size, bool seq, const BenchFlags& f, int warmup, int steps, int threads,
                    std::string* gpu_name) {
  const std::vector<std::string> argv = peer_argv(python, model, precision, batch, size, seq, f, warmup, steps, threads);
  return parse_peer_result(hw::run_subprocess(argv, f.peer_timeout), argv[1], batch, f, gpu_name);
}

// The peer under torch.compile, in the memory format its eager run found faster (compiling both would double the
// minutes inductor takes); a failure (a compile error) is this cell's message only.
BenchSide compiled_peer_cell(const std::string& python, const std::string& model, const std::string& precision,
                             int64_t batch, int64_t size, bool seq, const BenchFlags& f, int warmup, int steps,
                             int threads, const std::optional<BenchSide>& eager, std::string* gpu_name) {
  if (eager && !eager->ok) {  // what failed eager (no such model, a missing package) fails compiled too
    BenchSide s;
    s.error = "not measured: the eager peer failed";
    return s;
  }
  std::vector<std::string> argv = peer_argv(python, model, precision, batch, size, seq, f, warmup, steps, threads);
  argv.push_back("--compile");
  if (eager && (eager->memory_format == "nchw" || eager->memory_format == "channels_last")) {
    argv.push_back("--memory-format");
    argv.push_back(eager->memory_format);
  }
  return parse_peer_result(hw::run_subprocess(argv, f.peer_timeout), argv[1], batch, f, gpu_name);
}

// --interleave (CPU): the peer runs as a second process beside ours, warmed up, and takes one step (per memory
// format) after each of our timed steps, so both sides are timed in the same seconds. Between the two sides a short
// pause lets the other process's OpenMP threads stop spinning (libgomp spins for milliseconds after a region), so
// neither side's step shares the cores with the other's idle threads.
class InterleavedPeer {
 public:
  static constexpr int kPauseMs = 40;

  InterleavedPeer(const std::vector<std::string>& argv, const BenchFlags& f) : f_(f), script_(argv[1]) {
    std::vector<std::string> a = argv;
    a.push_back("--serve");
    proc_ = std::make_unique<hw::Subprocess>(a, false, true);
    if (!proc_->started()) return;
    const std::optional<std::string> line = proc_->read_line(f.peer_timeout);
    ready_ = line && line->find("\"ready\"") != std::string::npos;
    // A peer that cannot run the cell (PyTorch 1.13's CPU autocast refuses float16) prints its result object, with
    // the reason, instead of the ready line: finish() parses it from here.
    if (line && !ready_) first_line_ = *line;
  }

  // One peer step per memory format, after one of ours. A peer that stopped answering takes no more steps; its
  // exit status, read by finish(), says why.
  void step() {
    if (!ready_) return;
    pause();
    std::optional<std::string> line;
    if (proc_->write_line("step")) line = proc_->read_line(f_.peer_timeout);
    if (!line || line->find("\"seconds\"") == std::string::npos) ready_ = false;
    pause();
  }

  BenchSide finish(int64_t batch, std::string* gpu_name) {
    if (ready_) proc_->write_line("quit");
    hw::SubprocessResult r = proc_->wait(f_.peer_timeout);
    if (!first_line_.empty()) r.out = first_line_ + "\n" + r.out;
    return parse_peer_result(r, script_, batch, f_, gpu_name);
  }

 private:
  static void pause() { ::usleep(kPauseMs * 1000); }

  const BenchFlags& f_;
  std::string script_;
  std::unique_ptr<hw::Subprocess> proc_;
  bool ready_ = false;
  std::string first_line_;  // what the peer said instead of "ready", if anything
};

// --max-batch: the largest batch of the row's model, precision and input that fits `budget`, found by the fit
// finder's search (memory/fit.h) over probes on the meta device standing for the bench's device type (its
// allocator rules; the bench's optimizer, autocast and GradScaler). Seconds per row, whatever the batch.
BenchMaxBatch plan_max_batch(const std::string& model, const std::string& precision, const Sizes& sz, bool seq,
                             const BenchFlags& f, int64_t budget, DeviceType stands_for) {
  BenchMaxBatch out;
  const Stopwatch clock;
  try {
    train::FitProbeSetup s;
    s.cfg.model = model;
    s.cfg.optimizer = f.optimizer;
    s.cfg.recompute = f.recompute;
    const train::BenchPrecision bp = train::bench_precision_from_string(precision);
    // TF32 changes the arithmetic, not the tensors: it plans as FP32.
    s.cfg.precision = bp == train::BenchPrecision::FP16 ? DType::F16 : bp == train::BenchPrecision::BF16 ? DType::BF16
                                                                                                        : DType::F32;
    s.device = kMeta;
    s.stands_for = stands_for;
    s.budget = budget;
    s.steps = 2;
    if (seq && sz.size > 0) s.seq_len = sz.size;
    if (!seq) s.image_size = sz.size;
    s.channels_last = !f.nchw;
    memory::FitSearchOptions o;
    o.budget = budget;
    o.granule = static_cast<int64_t>(memory::kHostGranule);
    o.quick = true;  // one-step search probes, the answer confirmed with two steps
    const memory::FitResult r =
        memory::fit_search([&](int64_t b, bool full) { return train::run_fit_probe(s, b, full); }, o);
    out.batch = r.best;
    out.limited = r.limited;
  } catch (const Error& e) {
    out.error = e.what();
  }
  out.seconds = clock.seconds();
  return out;
}

// Gives the device's cached (free) memory back (its caching allocator's empty_cache, after the device's work).
// A failed cell may have left the device unusable: that is in its row already, so errors here are not reported.
void release_device_cache(const Device& dev) {
  try {
    runtime::synchronize(dev);
    if (memory::CachingAllocator* a = memory::caching_allocator_for(dev)) a->empty_cache();
  } catch (const std::exception&) {
  }
}

std::atomic<int> g_bench_stop_signal{0};  // the first SIGINT (Ctrl-C) or SIGTERM during `ampforge bench`

int run_bench(const BenchFlags& f) {
  AF_CHECK(!(f.channels_last && f.nchw), "--channels-last and --nchw exclude each other");
  AF_CHECK(f.threads >= 0, "--threads must be >= 0");
  AF_CHECK(f.peer_timeout > 0, "--peer-timeout must be > 0");
  AF_CHECK(f.peer_seconds >= 0 && f.peer_seconds <= 1e6, "--peer-seconds must be between 0 and 1e6, got {}",
           f.peer_seconds);
  AF_CHECK(f.optimizer == "sgd" || f.optimizer == "adamw", "--optimizer must be sgd or adamw, got '{}'", f.optimizer);
  Device dev;
  try {
    dev = Device::parse(f.device);
  } catch (const Error&) {
    AF_THROW(InvalidArgument, "--device must be cpu, cuda or cuda:N, got '{}'", f.device);
  }
  AF_CHECK(dev.is_cpu() || dev.is_cuda(), "--device must be cpu, cuda or cuda:N, got '{}'", f.device);
  runtime::check_device_exists(dev, "--device " + f.device);
  AF_CHECK(!f.cuda_graphs || dev.is_cuda(), "--cuda-graphs needs --device cuda");
  AF_CHECK(f.max_batch == !f.budget.empty(), "--max-batch and --budget go together (e.g. --max-batch --budget 16GiB)");
  int64_t max_batch_budget = 0;
  if (f.max_batch) {
    const uint64_t b = memory::parse_size(f.budget, "--budget");
    AF_CHECK(b > 0 && b <= (uint64_t{1} << 50), "--budget: must be more than 0 bytes and at most 1 PiB, got {}", f.budget);
    max_batch_budget = static_cast<int64_t>(b);
  }
  const bool full = f.full || dev.is_cuda();
  if (f.threads > 0) set_num_threads(f.threads);
  const int threads = get_num_threads();
  memory::install_host_caching_allocator();

  BenchReport rep;
  rep.version = AMPFORGE_VERSION_STRING;
  rep.device = dev.str();
  rep.threads = threads;
  rep.warmup = f.warmup >= 0 ? f.warmup : dev.is_cuda() ? 5 : 1;
  rep.steps = f.steps >= 0 ? f.steps : dev.is_cuda() ? 20 : 3;
  AF_CHECK(rep.steps >= 1, "--steps must be >= 1");
  rep.optimizer = f.optimizer;
  rep.max_batch_budget = max_batch_budget;
  if (max_batch_budget > 0)
    rep.max_batch_planner = fmt::format("meta device standing for {} ({}), {} optimizer", device_type_name(dev.type),
                                        runtime::plans_expandable_segments(dev.type)
                                            ? "expandable segments" : "plain segments, cuBLASLt/cuDNN workspace",
                                        f.optimizer);
  rep.channels_last = !f.nchw;
  rep.recompute = f.recompute;
  rep.cuda_graphs = f.cuda_graphs;
  rep.full = full;
  if (dev.is_cpu()) {
    const hw::HostInfo host = hw::probe_host();
    if (host.cpu_model.ok()) rep.device_name = *host.cpu_model;
    const cpu::BlasKernels& blas = cpu::select_blas_kernels();  // before the peer starts: it inherits the choice
    rep.blas_library = blas.version;
    rep.blas_core = blas.core;
    rep.blas_source = cpu::blas_source_name(blas.source);
    rep.cpu_products = cpu::cpu_gemm_summary();
    rep.cpu_convolutions = cpu::cpu_conv_summary();
  }

  // Models: the asked ones must exist; by default the brief's that this build has.
  const auto& reg = models::model_registry();
  std::vector<std::string> model_names;
  if (f.models.empty()) {
    for (const auto& m : kBriefModels) {
      if (reg.find(m)) model_names.push_back(m);
      else rep.unavailable_models.push_back(m);
    }
    AF_CHECK(!model_names.empty(), "none of the brief's models ({}) is in this build; name one with --models",
             fmt::join(kBriefModels, ", "));
  } else {
    model_names = split(f.models);
    for (const auto& m : model_names) reg.at(m);  // unknown names: InvalidArgument listing the known ones
  }
  std::vector<std::string> precisions =
      f.precisions.empty() ? (dev.is_cuda() ? std::vector<std::string>{"fp32", "tf32", "fp16", "bf16"}
                                            : std::vector<std::string>{"fp32", "bf16"})
                           : split(f.precisions);
  for (const auto& p : precisions) train::bench_precision_from_string(p);
  const auto batches = parse_batches(f.batches);
  for (const auto& [m, n] : batches)
    AF_CHECK(std::find(model_names.begin(), model_names.end(), m) != model_names.end(),
             "--batch {}={}: {} is not among the benchmarked models", m, n, m);

  // Usage errors before the peer is looked for (importing torch takes seconds per interpreter tried).
  AF_CHECK(!f.interleave || !dev.is_cuda(),
           "--interleave is for the CPU, whose speed drifts between runs (CUDA steps are timed with CUDA events)");
  AF_CHECK(!f.interleave || f.peer != "none",
           "--interleave interleaves the peer's steps with ours: not with --peer none");
  std::string peer_python, why, peer_missing;
  if (f.peer != "none") {
    peer_python = find_peer_python(f.peer, &rep.peer_torch, &why);
    // An interpreter that cannot be run is a usage error (a typo); one that runs without torch is a peer that
    // cannot measure: ampforge's cells are still measured, and every peer cell says why and how to get one.
    AF_CHECK(!peer_python.empty() || f.peer == "auto" || !find_program(f.peer).empty(),
             "--peer {}: cannot run it ({})", f.peer, why);
    if (peer_python.empty() && f.peer != "auto")
      peer_missing = fmt::format("torch is not installed in {}: `scripts/setup --peer` installs PyTorch 2.14 into "
                                 ".venv-peer/ (or name another --peer)", f.peer);
    rep.peer_python = peer_python;
  }
  const bool interleave = f.interleave && !peer_python.empty();
  // The torch.compile column: with a PyTorch 2.x peer unless --no-compile (measured once per cell, after the rounds).
  const bool compile_peer = !peer_python.empty() && !f.no_compile && std::atoi(rep.peer_torch.c_str()) >= 2;
  rep.interleaved = interleave;
  rep.sizes_note = full ? (dev.is_cuda() ? "the brief's batch sizes (GPU)" : "the brief's batch sizes (--full)")
                        : "reduced for a CPU (--full for the brief's): ";
  bool first_size = true;
  std::string profile_text;  // --profile: each cell's report, printed after the table

  const int total_cells = static_cast<int>(model_names.size() * precisions.size());
  rep.cells_asked = total_cells;
  // Ctrl-C or SIGTERM (`timeout`, a batch system's time limit): the cell in progress finishes, then the table (and
  // files) of the cells measured; a second signal stops at once. Taken on a watcher thread (util/signals.h), never
  // by a handler on a thread inside a kernel.
  for (int sig : {SIGINT, SIGTERM})
    watch_signal(sig, [sig](int) {
      int none = 0;
      if (!g_bench_stop_signal.compare_exchange_strong(none, sig)) die_by_signal(sig);
      std::fprintf(stderr, "\n%s: finishing this cell, then the table of the cells measured (%s again to stop at "
                   "once)\n", sig == SIGINT ? "interrupted" : "SIGTERM", sig == SIGINT ? "Ctrl-C" : "a signal");
    });
  int cell = 0;
  for (const std::string& m : model_names) {
    if (g_bench_stop_signal.load() != 0) break;
    const models::ModelEntry& entry = reg.at(m);
    const bool seq = tasks::task_of(entry).input == tasks::InputKind::TokenIds;
    Sizes sz = default_sizes(m, seq, full);
    if (auto it = batches.find(m); it != batches.end()) sz.batch = it->second;
    if (!seq && f.image_size > 0) sz.size = f.image_size;
    if (seq && f.seq_len > 0) sz.size = f.seq_len;
    if (!full) {
      rep.sizes_note += fmt::format("{}{} batch {}{}", first_size ? "" : ", ", m, sz.batch,
                                    sz.size > 0 ? fmt::format(" {} {}", seq ? "seq" : "size", sz.size) : "");
      first_size = false;
    }
    for (const std::string& p : precisions) {
      if (g_bench_stop_signal.load() != 0) break;
      ++cell;
      BenchRow row;
      row.model = m;
      row.precision = p;
      row.batch = sz.batch;
      // --rounds N: N alternating (ampforge, peer) measurements; the row keeps the round whose ratio is the median
      // (the lower one of the middle two for even N), every round's ratio goes to round_ratios.
      std::vector<std::pair<BenchSide, std::optional<BenchSide>>> rounds;
      for (int round = 0; round < f.rounds; ++round) {
        if (round > 0) std::fprintf(stderr, "\n");
        row.ours = BenchSide{};
        row.peer.reset();
        std::unique_ptr<InterleavedPeer> inter;
        std::fprintf(stderr, "bench [%d/%d] %s %s batch %lld%s: ampforge ...", cell, total_cells, m.c_str(), p.c_str(),
                     static_cast<long long>(sz.batch),
                     f.rounds > 1 ? fmt::format(" (round {}/{})", round + 1, f.rounds).c_str() : "");
        std::fflush(stderr);
        try {
          train::WorkloadOptions wo;
          wo.batch = sz.batch;
          if (seq) wo.seq_len = sz.size > 0 ? sz.size : wo.seq_len;
          else wo.image_size = sz.size;
          wo.device = dev;
          wo.channels_last = !f.nchw;
          train::Workload w = train::make_workload(m, wo);
          row.input = w.input;
          train::BenchmarkOptions bo;
          bo.precision = train::bench_precision_from_string(p);
          bo.warmup = rep.warmup;
          bo.steps = rep.steps;
          bo.optimizer = f.optimizer;
          bo.cuda_graphs = f.cuda_graphs;
          bo.recompute = f.recompute;
          bo.profile = f.profile && round == 0;
          // --interleave: the peer starts (and warms up) first, then steps after each of our timed steps.
          if (interleave) {
            std::fprintf(stderr, " (PyTorch interleaved, warming up ...)");
            std::fflush(stderr);
            inter = std::make_unique<InterleavedPeer>(
                peer_argv(peer_python, m, p, sz.batch, sz.size, seq, f, rep.warmup, rep.steps, threads), f);
          }
          bo.on_step = [&, warmup = rep.warmup](int done, int all) {
            std::fprintf(stderr, " %d/%d", done, all);
            if (inter && done > warmup) inter->step();
            std::fflush(stderr);
          };
          const train::BenchmarkResult r = train::benchmark_training(w, bo);
          row.ours.ok = true;
          row.ours.samples_per_sec = r.samples_per_sec;
          row.ours.mean_samples_per_sec = r.mean_samples_per_sec;
          row.ours.median_seconds = r.median_seconds;
          row.ours.step_seconds = r.step_seconds;
          row.ours.peak_allocated_bytes = r.peak_allocated_bytes;
          row.ours.peak_reserved_bytes = r.peak_reserved_bytes;
          row.ours.parameters = r.parameters;
          row.ours.last_loss = r.last_loss;
          row.ours.timer = r.timer;
          row.ours.memory_format = f.nchw ? "nchw" : "channels_last";
          if (r.profile) {
            const profiler::Report pr = profiler::compute_report(*r.profile);
            row.ours.profile = profiler::report_to_json(pr, 50);
            profile_text += fmt::format("\n{} {} batch {}, one profiled step (not timed):\n{}", m, p, sz.batch,
                                        profiler::format_report(pr));
          }
          std::fprintf(stderr, " %.1f samples/s", r.samples_per_sec);
        } catch (const Error& e) {
          row.ours.error = e.what();
          std::fprintf(stderr, " failed");
        }
        // The cell's tensors are gone; what the caching allocator keeps of them goes back to the device before the
        // peer, a process of its own, needs the memory (on a 16 GB card it would run out beside our cache).
        if (dev.is_cuda()) release_device_cache(dev);
        if (inter) {
          row.peer = inter->finish(sz.batch, &rep.device_name);
          inter.reset();
          std::fprintf(stderr, "; PyTorch%s", row.peer->ok ? fmt::format(" {:.1f} samples/s", row.peer->samples_per_sec).c_str() : " failed");
        } else if (!peer_python.empty()) {
          std::fprintf(stderr, "; PyTorch ...");
          std::fflush(stderr);
          row.peer = peer_cell(peer_python, m, p, sz.batch, sz.size, seq, f, rep.warmup, rep.steps, threads,
                               &rep.device_name);
          std::fprintf(stderr, row.peer->ok ? " %.1f samples/s" : " failed", row.peer->samples_per_sec);
        } else if (!peer_missing.empty()) {
          row.peer = BenchSide{};
          row.peer->error = peer_missing;
        }
        rounds.emplace_back(row.ours, row.peer);
      }
      if (f.rounds > 1) {
        std::vector<std::pair<double, size_t>> by_ratio;
        for (size_t k = 0; k < rounds.size(); ++k) {
          const auto& [o, pr] = rounds[k];
          if (o.ok && pr && pr->ok && pr->samples_per_sec > 0) {
            const double r = o.samples_per_sec / pr->samples_per_sec;
            row.round_ratios.push_back(r);
            by_ratio.emplace_back(r, k);
          }
        }
        if (!by_ratio.empty()) {
          std::sort(by_ratio.begin(), by_ratio.end());
          const size_t pick = by_ratio[(by_ratio.size() - 1) / 2].second;
          row.ours = rounds[pick].first;
          row.peer = rounds[pick].second;
          row.ours.profile = rounds[0].first.profile;  // --profile: round 0's step
        }
      }
      if (compile_peer) {
        std::fprintf(stderr, "; torch.compile ...");
        std::fflush(stderr);
        row.compiled = compiled_peer_cell(peer_python, m, p, sz.batch, sz.size, seq, f, rep.warmup, rep.steps, threads,
                                          row.peer, &rep.device_name);
        std::fprintf(stderr, row.compiled->ok ? " %.1f samples/s" : " failed", row.compiled->samples_per_sec);
      }
      for (const auto& [who, side] : {std::pair<const char*, const std::optional<BenchSide>*>{"PyTorch", &row.peer},
                                      {"PyTorch compiled", &row.compiled}})
        if (*side && (*side)->ok && !(*side)->profile.is_null())
          profile_text += fmt::format("\n{} {} batch {}, {}: {}", m, p, sz.batch, who, peer_profile_text((*side)->profile));
      if (row.input.empty())
        row.input = seq ? fmt::format("seq {}", sz.size) : sz.size > 0 ? fmt::format("{0}x{0}", sz.size) : "default";
      if (max_batch_budget > 0) {
        std::fprintf(stderr, "; max batch ...");
        std::fflush(stderr);
        row.max_batch = plan_max_batch(m, p, sz, seq, f, max_batch_budget, dev.type);
        if (row.max_batch->error.empty())
          std::fprintf(stderr, " %lld", static_cast<long long>(row.max_batch->batch));
        else
          std::fprintf(stderr, " failed");
      }
      std::fprintf(stderr, "\n");
      rep.rows.push_back(std::move(row));
    }
  }
  if (f.peer == "auto" && peer_python.empty()) {
    while (!why.empty() && (why.back() == ' ' || why.back() == ';')) why.pop_back();
    rep.sizes_note += "; peer: no Python with torch found (" + why +
                      "; `scripts/setup --peer` installs Debian's PyTorch, or give --peer PYTHON)";
  }
  const int stop_signal = g_bench_stop_signal.load();
  rep.interrupted = stop_signal != 0;
  rep.interrupted_by = stop_signal == SIGINT ? "Ctrl-C" : stop_signal == SIGTERM ? "SIGTERM" : "";
  compute_derived(rep);
  if (!f.markdown.empty()) write_file_atomically(f.markdown, bench_markdown(rep), "Markdown file");
  if (!f.svg.empty()) write_file_atomically(f.svg, bench_svg(rep), "SVG file");
  if (f.json) std::printf("%s\n", bench_to_json(rep).dump(2).c_str());
  else std::printf("%s", bench_table(rep).c_str());
  if (!profile_text.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s", profile_text.c_str());
  }
  if (rep.interrupted) return 128 + stop_signal;
  bool any_ok = false;
  for (const auto& r : rep.rows) any_ok = any_ok || r.ours.ok;
  return any_ok ? 0 : 1;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  auto* sub = app.add_subcommand(
      "bench", "Training throughput of the brief's models, FP32 vs FP16/BF16 (and TF32 on a GPU), PyTorch beside");
  sub->add_option("--models", f->models,
                  "Comma-separated models (default: the brief's resnet50, bert-base, yolov8n, yolov8s that this "
                  "build has; any `ampforge models` name works)");
  sub->add_option("--precisions", f->precisions, "Comma-separated: fp32, tf32 (CUDA), fp16, bf16 (default: CPU "
                  "fp32,bf16, the 16-bit type of CPU autocast; CUDA fp32,tf32,fp16,bf16)");
  sub->add_option("--device", f->device, "cpu | cuda | cuda:N")->capture_default_str();
  sub->add_option("--batch", f->batches, "Per-model batch sizes: MODEL=N[,MODEL=N...] (default: see --full)");
  sub->add_option("--image-size", f->image_size, "Square image size for image models (default: per model)");
  sub->add_option("--seq-len", f->seq_len, "Sequence length for sequence models (default: per model)");
  sub->add_flag("--interleave", f->interleave,
                "CPU: run the peer beside ampforge and time one PyTorch step after each of ampforge's, so both are "
                "measured in the same seconds of a machine whose speed drifts (docs/BENCH.md)");
  sub->add_option("--rounds", f->rounds,
                  "Measure each cell N times, ampforge and the peer alternating, and keep the round with the median "
                  "ratio (for machines whose speed drifts; every round's ratio is listed)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  sub->add_option("--warmup", f->warmup, "Untimed steps first (default: CPU 1, CUDA 5)");
  sub->add_option("--steps", f->steps, "Timed steps (default: CPU 3, CUDA 20)");
  sub->add_option("--threads", f->threads, "CPU threads for ampforge and the peer (default: all cores)");
  sub->add_option("--optimizer", f->optimizer, "sgd (momentum 0.9) | adamw, lr 1e-3")->capture_default_str();
  sub->add_flag("--channels-last", f->channels_last, "Images in channels-last layout (the default)");
  sub->add_flag("--nchw", f->nchw, "Images in NCHW layout");
  sub->add_flag("--cuda-graphs", f->cuda_graphs, "CUDA: capture each training step once and replay it");
  sub->add_flag("--profile", f->profile, "After each cell's timed steps, profile one more step of ampforge's (ops, "
                "phases; kernels on a GPU) and of the peer's (torch.profiler) and print the reports on stderr (in "
                "--json: each cell's \"profile\")");
  sub->add_flag("--recompute", f->recompute, "Steps as `ampforge train --recompute` runs them (cheap activations "
                "rebuilt in backward; the peer keeps its default)");
  sub->add_flag("--full", f->full, "The brief's batch sizes on any device (a GPU gets them by default)");
  sub->add_option("--peer", f->peer,
                  "auto (a Python with PyTorch: $AMPFORGE_PEER_PYTHON, the source tree's .venv-peer, /usr/bin/python3, "
                  "python3) | none | PYTHON")
      ->capture_default_str();
  sub->add_option("--peer-timeout", f->peer_timeout, "Seconds one peer cell may take")->capture_default_str();
  sub->add_option("--peer-seconds", f->peer_seconds,
                  "CPU: the peer's timed steps (per memory format) stop once they took this many seconds, after at "
                  "least one (0: always --steps)")
      ->capture_default_str();
  sub->add_flag("--no-compile", f->no_compile,
                "No torch.compile column (by default a PyTorch 2.x peer is also measured under torch.compile, inductor, "
                "in its faster memory format; compiling takes minutes per cell on a CPU)");
  sub->add_flag("--max-batch", f->max_batch,
                "Add a column: the largest batch of each row whose training step fits --budget, planned on the meta "
                "device standing for --device (seconds per row; docs/BENCH.md)");
  sub->add_option("--budget", f->budget, "Device memory for --max-batch, e.g. 16GiB");
  sub->add_flag("--json", f->json, "Print the results as JSON (schema in docs/BENCH.md) instead of the table");
  sub->add_option("--markdown", f->markdown, "Also write the table as Markdown to this file");
  sub->add_option("--svg", f->svg, "Also write a bar chart (SVG) to this file");
  sub->add_flag("--collective", f->collective,
                "Instead: all-reduce and all-gather bandwidth between the ranks of a data-parallel job (start it "
                "with `ampforge launch -n N -- ampforge bench --collective`), nccl-tests' algbw and busbw; with "
                "--device, --warmup, --steps (iterations), --json");
  sub->add_option("--min-bytes", f->coll.min_bytes, "--collective: smallest size")->capture_default_str();
  sub->add_option("--max-bytes", f->coll.max_bytes, "--collective: largest size")->capture_default_str();
  sub->add_option("--factor", f->coll.factor, "--collective: size multiplier between steps")->capture_default_str();
  return {sub, [f] {
            if (!f->collective) return run_bench(*f);
            CollectiveBenchOptions o = f->coll;
            o.device = f->device;
            o.json = f->json;
            if (f->warmup >= 0) o.warmup = f->warmup;
            if (f->steps >= 0) o.iterations = f->steps;
            return run_collective_bench(o);
          }};
}

}  // namespace ampforge::cli
