// The tools as functions returning plain dicts (the CLI's --json documents, parsed): doctor(), bench(),
// memory_fit(), memory_replay(); safetensors files (save_file / load_file); the model registry (ampforge.models);
// threads. Each runs as an EngineCall (GIL released).
#include <fstream>

#include "common.h"

#include "ampforge/backends/cpu/blas_kernels.h"
#include "ampforge/backends/cpu/matmul_onednn.h"
#include "ampforge/hw/doctor.h"
#include "ampforge/memory/caching_allocator.h"
#include "ampforge/memory/fit.h"
#include "ampforge/memory/stats.h"
#include "ampforge/memory/torch_report.h"
#include "ampforge/memory/torch_snapshot.h"
#include "ampforge/memory/trace.h"
#include "ampforge/models/registry.h"
#include "ampforge/train/benchmark.h"
#include "ampforge/train/fit_probe.h"
#include "ampforge/train/workload.h"
#include "ampforge/util/file.h"

namespace ampforge::python {

namespace {

nb::object json_to_python(const nlohmann::json& j) {
  return nb::module_::import_("json").attr("loads")(j.dump());
}

int64_t bytes_from(nb::handle h, const char* what) {
  if (PyLong_Check(h.ptr())) return nb::cast<int64_t>(h);
  return static_cast<int64_t>(af::memory::parse_size(nb::cast<std::string>(h), what));
}

hw::BlasReport blas_report() {
  const af::cpu::BlasKernels& k = af::cpu::select_blas_kernels();
  return hw::BlasReport{.known = true,
                        .library = k.library,
                        .version = k.version,
                        .loaded_core = k.loaded_core,
                        .core = k.core,
                        .cpu_best = k.cpu_best,
                        .source = af::cpu::blas_source_name(k.source),
                        .note = k.note,
                        .below_cpu = k.below_cpu(),
                        .products = af::cpu::cpu_gemm_summary()};
}

bool is_pickle(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char c = 0;
  return in.get(c) && static_cast<unsigned char>(c) == 0x80;  // pickle protocol 2+ starts with PROTO
}

}  // namespace

void init_tools(nb::module_& m) {
  // ---- safetensors -----------------------------------------------------------------------------------------
  m.def("save_file",
        [](nb::handle tensors, const std::string& path, std::optional<std::map<std::string, std::string>> metadata) {
          std::vector<std::pair<std::string, af::Tensor>> v;
          nb::object from_dlpack;
          for (nb::handle k : nb::borrow<nb::object>(tensors)) {
            nb::object t = tensors[k];
            if (!nb::isinstance<af::Tensor>(t)) {
              if (!from_dlpack.is_valid()) from_dlpack = nb::module_::import_("ampforge").attr("from_dlpack");
              t = from_dlpack(t);
            }
            v.emplace_back(nb::cast<std::string>(k), nb::cast<af::Tensor>(t).detach());
          }
          EngineCall call;
          af::save_safetensors(path, v, metadata.value_or(std::map<std::string, std::string>{}));
        },
        nb::arg("tensors"), nb::arg("filename"), nb::arg("metadata") = nb::none(),
        "Writes name -> tensor as a safetensors file, atomically (safetensors.torch.save_file's arguments).");
  m.def("load_file",
        [](const std::string& path) {
          af::SafetensorsFile f;
          {
            EngineCall call;
            f = af::load_safetensors(path);
          }
          nb::dict d;
          for (auto& [k, t] : f.tensors) d[k.c_str()] = t;
          return d;
        },
        nb::arg("filename"), "Reads a safetensors file into name -> tensor (in file order).");
  m.def("load_file_metadata",
        [](const std::string& path) {
          EngineCall call;
          return af::load_safetensors(path).metadata;
        },
        nb::arg("filename"));

  // ---- models ------------------------------------------------------------------------------------------------
  m.def("model_names", [] { return af::models::names(); });
  m.def("create_model",
        [](const std::string& name, std::optional<int64_t> in_channels, std::optional<int64_t> num_classes,
           std::optional<int64_t> image_size) {
          const af::models::ModelEntry& e = af::models::model_registry().at(name);
          af::models::ModelOptions o = e.defaults;
          if (in_channels) o.in_channels = *in_channels;
          if (num_classes) o.num_classes = *num_classes;
          if (image_size) o.image_size = *image_size;
          EngineCall call;
          return af::models::create(name, o);
        },
        nb::arg("name"), nb::arg("in_channels") = nb::none(), nb::arg("num_classes") = nb::none(),
        nb::arg("image_size") = nb::none(), "A model of the registry (`ampforge models`), randomly initialised.");
  m.def("model_info",
        [](const std::string& name) {
          const af::models::ModelEntry& e = af::models::model_registry().at(name);
          nb::dict d;
          d["name"] = e.name, d["task"] = e.task, d["description"] = e.description;
          d["in_channels"] = e.defaults.in_channels, d["num_classes"] = e.defaults.num_classes;
          d["image_size"] = e.defaults.image_size;
          return d;
        },
        nb::arg("name"));

  // ---- devices -------------------------------------------------------------------------------------------------
  m.def("cuda_device_count", [] { return af::runtime::device_runtime(af::DeviceType::CUDA).device_count(); });
  m.def("synchronize",
        [](std::optional<af::Device> d) {
          EngineCall call;
          af::runtime::synchronize(d.value_or(af::Device(af::DeviceType::CUDA, 0)));
        },
        nb::arg("device") = nb::none());

  // ---- threads -------------------------------------------------------------------------------------------------
  m.def("get_num_threads", &af::get_num_threads);
  m.def("set_num_threads", &af::set_num_threads, nb::arg("n"));

  // ---- doctor, bench, memory -------------------------------------------------------------------------------------
  m.def("doctor",
        [](bool bandwidth, double python_timeout) {
          hw::DoctorOptions o;
          o.measure_bandwidth = bandwidth;
          o.python_timeout_s = python_timeout;
          nlohmann::json j;
          {
            EngineCall call;
            o.blas = blas_report();
            j = hw::doctor_report_json(hw::run_doctor(o));
          }
          return json_to_python(j);
        },
        nb::arg("bandwidth") = true, nb::arg("python_timeout") = 6.0,
        "`ampforge doctor --json` as a dict (schema ampforge.doctor/2, docs/DOCTOR.md).");
  m.def("bench",
        [](const std::string& model, int64_t batch, const std::string& precision, int steps, int warmup,
           const std::string& optimizer, int64_t image_size, std::optional<af::Device> device, bool channels_last) {
          af::train::WorkloadOptions wo;
          wo.batch = batch, wo.image_size = image_size, wo.device = device.value_or(af::kCPU);
          wo.channels_last = channels_last;
          af::train::BenchmarkOptions bo;
          bo.precision = af::train::bench_precision_from_string(precision);
          bo.steps = steps, bo.warmup = warmup, bo.optimizer = optimizer;
          AF_CHECK(steps >= 1 && warmup >= 0, "bench: steps must be >= 1 and warmup >= 0");
          af::train::BenchmarkResult r;
          af::train::Workload w;
          {
            EngineCall call;
            w = af::train::make_workload(model, wo);
            r = af::train::benchmark_training(w, bo);
          }
          nb::dict d;
          d["model"] = model, d["batch"] = batch, d["precision"] = precision, d["input"] = w.input;
          d["device"] = wo.device.str();
          d["step_seconds"] = r.step_seconds, d["median_seconds"] = r.median_seconds;
          d["mean_seconds"] = r.mean_seconds, d["samples_per_sec"] = r.samples_per_sec;
          d["peak_allocated_bytes"] = r.peak_allocated_bytes, d["peak_reserved_bytes"] = r.peak_reserved_bytes;
          d["parameters"] = r.parameters, d["last_loss"] = r.last_loss, d["timer"] = r.timer;
          d["threads"] = af::get_num_threads();
          return d;
        },
        nb::arg("model") = "cnn", nb::arg("batch") = 128, nb::arg("precision") = "fp32", nb::arg("steps") = 5,
        nb::arg("warmup") = 2, nb::arg("optimizer") = "sgd", nb::arg("image_size") = 0, nb::arg("device") = nb::none(),
        nb::arg("channels_last") = true,
        "Timed training steps of a registry model on a synthetic batch (one cell of `ampforge bench`).");
  m.def("memory_fit",
        [](const std::string& model, nb::handle budget, const std::string& device, const std::string& stands_for,
           const std::string& precision, const std::string& optimizer, int64_t max_batch, int64_t steps,
           int64_t image_size) {
          af::train::FitProbeSetup s;
          AF_CHECK(device == "cpu" || device == "meta", "memory_fit: device must be 'cpu' or 'meta', got '{}'", device);
          AF_CHECK(stands_for == "cpu" || stands_for == "cuda", "memory_fit: stands_for must be 'cpu' or 'cuda'");
          AF_CHECK(steps >= 1 && steps <= 10, "memory_fit: steps must be in [1, 10], got {}", steps);
          AF_CHECK(max_batch >= 1, "memory_fit: max_batch must be >= 1");
          s.device = af::Device::parse(device);
          s.stands_for = stands_for == "cpu" ? af::DeviceType::CPU : af::DeviceType::CUDA;
          s.budget = bytes_from(budget, "budget");
          AF_CHECK(s.budget > 0, "memory_fit: the budget must be more than 0 bytes");
          s.steps = steps, s.image_size = image_size;
          s.cfg.model = model, s.cfg.optimizer = optimizer, s.cfg.precision = af::dtype_from_string(precision);
          af::models::model_registry().at(model);  // an unknown name is a ValueError listing the known ones
          af::memory::FitSearchOptions o;
          o.budget = s.budget, o.max_batch = max_batch, o.quick = steps > 1;
          o.granule = static_cast<int64_t>(af::memory::kHostGranule);
          nlohmann::json j;
          {
            EngineCall call;
            const af::memory::FitResult r = af::memory::fit_search(
                [&](int64_t b, bool full) { return af::train::run_fit_probe(s, b, full); }, o);
            j = af::memory::fit_result_to_json(r, s.budget);
          }
          return json_to_python(j);
        },
        nb::arg("model"), nb::arg("budget"), nb::arg("device") = "cpu", nb::arg("stands_for") = "cuda",
        nb::arg("precision") = "fp32", nb::arg("optimizer") = "adamw", nb::arg("max_batch") = 65536,
        nb::arg("steps") = 2, nb::arg("image_size") = 0,
        "The largest batch whose training step fits `budget` (bytes or '16GiB'), as `ampforge memory fit --json`.");
  m.def("memory_replay",
        [](const std::string& path, const std::string& policy, nb::handle budget, nb::handle device) {
          const int64_t b = budget.is_none() ? 0 : bytes_from(budget, "budget");
          nlohmann::json j;
          {
            EngineCall call;
            af::check_readable_file(path, "memory trace or snapshot");
            if (is_pickle(path)) {
              const af::memory::TorchSnapshot snap = af::memory::torch_snapshot_read(path);
              const af::memory::TorchReplayInput in = af::memory::torch_trace_build(
                  snap, device.is_none() ? af::memory::torch_default_device(snap) : nb::cast<int>(device));
              const auto policies =
                  policy == "all" ? af::memory::torch_policy_names() : std::vector<std::string>{policy};
              j = af::memory::torch_replay_report_json(
                  af::memory::torch_replay_report(snap, in, policies, static_cast<uint64_t>(b), 0));
            } else {
              const af::memory::Trace trace = af::memory::trace_read(path);
              af::memory::ReplayOptions opt;
              opt.budget = static_cast<uint64_t>(b);
              const auto policies =
                  policy == "all" ? std::vector<std::string>{"naive", "pytorch", "ampforge"} : std::vector<std::string>{policy};
              j = {{"trace", path}, {"events", trace.events.size()}, {"budget", b}};
              j["results"] = nlohmann::json::array();
              for (const auto& p : policies)
                j["results"].push_back(
                    af::memory::replay_result_to_json(af::memory::trace_replay(trace, af::memory::PolicyConfig::by_name(p), opt)));
            }
          }
          return json_to_python(j);
        },
        nb::arg("path"), nb::arg("policy") = "all", nb::arg("budget") = nb::none(), nb::arg("device") = nb::none(),
        "Replays an ampforge memtrace or a PyTorch memory snapshot pickle under allocator policies, as "
        "`ampforge memory replay --json`.");
}

}  // namespace ampforge::python
