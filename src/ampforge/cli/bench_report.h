// `ampforge bench`'s results and the forms they are written in: the terminal table, JSON (schema
// "ampforge-bench v1", documented in docs/BENCH.md), a Markdown table and an SVG bar chart.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ampforge::cli {

// One side of a cell (ampforge or the peer): a measurement, or why there is none.
struct BenchSide {
  bool ok = false;
  std::string error;             // when !ok: what failed (shown, never hidden)
  double samples_per_sec = 0;    // batch / median step time
  double mean_samples_per_sec = 0;
  double median_seconds = 0;
  std::vector<double> step_seconds;
  int64_t peak_allocated_bytes = -1, peak_reserved_bytes = -1;  // -1: not known
  int64_t parameters = 0;
  double last_loss = 0;
  std::string timer;             // "cuda events" | "host clock"
  std::string memory_format;     // the peer's best layout ("nchw" | "channels_last"), or ampforge's
  std::string skipped;           // the peer's layouts it did not time, and why ("channels_last: not timed: ..."); "" if none
  nlohmann::json profile;        // --profile (ampforge's side): the profiler's report of one extra step; null if not asked
};

// The brief's RTX 4080 figures for a model (samples/s, FP32 and FP16).
struct BenchReference {
  double fp32 = 0, fp16 = 0;
  std::string label;  // what was measured: "ResNet50 bs256"
};
std::optional<BenchReference> brief_reference(const std::string& model);
// Where the brief's figures come from.
extern const char* const kBriefEnvironment;

// `--max-batch`: the largest batch of a row's model, precision and input whose training step fits the budget,
// planned on the meta device (train/fit_probe.h, memory/fit.h), or why there is none.
struct BenchMaxBatch {
  int64_t batch = 0;   // 0: not even batch 1 fits
  bool limited = false;  // the search's cap fitted: the budget may hold more
  std::string error;   // non-empty: the plan failed (shown, never hidden)
  double seconds = 0;  // the search's time
};

struct BenchRow {
  std::string model, precision, input;
  int64_t batch = 0;
  std::optional<BenchMaxBatch> max_batch;  // nullopt: not asked (no --max-batch)
  BenchSide ours;
  std::optional<BenchSide> peer;  // nullopt: no peer asked (--peer none)
  // The peer under torch.compile (inductor) in its eager best memory format; nullopt: not asked (--no-compile, no
  // peer, or a peer older than PyTorch 2.0).
  std::optional<BenchSide> compiled;
  // ours / our fp32 row of the same model, as a gain in percent; nullopt without both.
  std::optional<double> gain_vs_fp32_percent;
  std::optional<double> ratio;  // ours / peer samples/s
  std::optional<double> ratio_compiled;  // ours / compiled peer samples/s
  std::vector<double> round_ratios;  // --rounds N > 1: each round's ratio, in measurement order
};

struct BenchReport {
  std::string version, device, device_name, peer_python, peer_torch;
  // CPU runs: the BLAS and the kernel set its GEMMs run (backends/cpu/blas_kernels.h); the peer's PyTorch loads the
  // same system OpenBLAS and inherits OPENBLAS_CORETYPE, so both sides run the same GEMM kernels.
  std::string blas_library, blas_core, blas_source;
  std::string cpu_products;  // which library runs ampforge's F32 / BF16 products (cpu::cpu_gemm_summary())
  std::string cpu_convolutions;  // which path and kernels run its convolutions (cpu::cpu_conv_summary())
  int threads = 0, warmup = 0, steps = 0;
  std::string optimizer;
  bool channels_last = true, cuda_graphs = false, full = false, recompute = false;
  bool interleaved = false;  // --interleave: the peer stepped after each of ampforge's timed steps
  std::string sizes_note;  // e.g. "reduced CPU sizes (--full for the brief's)"
  std::vector<std::string> unavailable_models;  // asked for by default but not in this build
  int64_t max_batch_budget = 0;   // --max-batch --budget, bytes; 0: no max-batch column
  std::string max_batch_planner;  // how it was planned, e.g. "meta device standing for cuda"
  int cells_asked = 0;            // model x precision cells asked for
  bool interrupted = false;       // Ctrl-C or SIGTERM: the rows are the cells measured before it
  std::string interrupted_by;     // "Ctrl-C" | "SIGTERM" when interrupted
  std::vector<BenchRow> rows;
};

// Fills gain_vs_fp32_percent and ratio from the measurements.
void compute_derived(BenchReport& r);

nlohmann::json bench_to_json(const BenchReport& r);
std::string bench_table(const BenchReport& r);     // for the terminal
// A peer cell's "profile" (torch_bench_peer.py --profile: {"step_ms", "ops": [{"name", "calls", "self_ms",
// "total_ms"}]}) as text: the profiled step's time and its operators by self time; a malformed one says so.
std::string peer_profile_text(const nlohmann::json& profile);
std::string bench_markdown(const BenchReport& r);  // a Markdown table with a header paragraph
// One bar per measured side of each cell (ampforge and peer), grouped by model, the FP32 rows first.
std::string bench_svg(const BenchReport& r);

}  // namespace ampforge::cli
