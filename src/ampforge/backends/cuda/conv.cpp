// CUDA conv2d, conv2d_backward_input and conv2d_backward_weight through cuDNN (its convolution API:
// tensor/filter/convolution descriptors and cudnnConvolution{Forward,BackwardData,BackwardFilter}).
// Why cuDNN: it is NVIDIA's library for exactly this, with implicit-GEMM, Winograd, FFT and tensor-core
// kernels tuned for every GPU generation; kernels of our own would be slower for years.
//
// Contracts (ops/conv.cpp, as for the CPU kernels in backends/cpu/conv.cpp):
//   conv2d                  in: x (N, C, H, W) laid out as the output, weight (C_out, C/groups, kH, kW)
//                           [, bias (C_out)]; out: y (N, C_out, OH, OW), conv2d_memory_format(x, weight).
//   conv2d_backward_input   in: grad_out, weight; out: grad_in (N, C, H, W), contiguous or channels-last.
//   conv2d_backward_weight  in: grad_out, x; out: grad_weight (contiguous). The bias gradient is not made
//                           here: autograd sums grad_out over (N, H, W) with the reduction kernels.
//   Images are each contiguous or channels-last; weight and bias have any strides; one dtype (F32, F16,
//   BF16) throughout. Outputs are overwritten.
//
// Layout: each call runs with x, w and y in ONE layout, copying an operand in the other layout into a
// temporary first. cuDNN describes a filter by a format (NCHW or NHWC), not by strides, and its kernels
// are built for operands in one layout (notably the NHWC tensor-core ones); with mixed layouts algorithms
// are refused or fall back to slow generic kernels. The common layout is the output's for conv2d and
// conv2d_backward_input (an output cannot change its layout), and for conv2d_backward_weight channels-last
// when either activation-sized input is (the small weight gradient is then computed channels-last and
// copied into the contiguous output). The usual copy is a contiguous weight of a channels-last network
// (weight-sized, as in PyTorch). Image tensors are described with their real strides
// (cudnnSetTensor4dDescriptorEx); only the stride of a size-1 dim, which addresses nothing and can be any
// value, is replaced by the layout's packed stride so that cuDNN recognises the layout. The filter's
// format is CUDNN_TENSOR_NHWC for channels-last, CUDNN_TENSOR_NCHW otherwise. Should cuDNN have no
// algorithm for a channels-last problem, the call is retried in NCHW (copies both ways).
//
// Precision: F16/BF16 data with F32 compute (convolution compute type CUDNN_DATA_FLOAT) and
// CUDNN_TENSOR_OP_MATH. F32 may use TF32 tensor cores by default, as PyTorch's
// torch.backends.cudnn.allow_tf32 = True (unlike matmul, see cuda::allow_tf32);
// cuda::set_cudnn_allow_tf32(false) or AMPFORGE_CUDNN_ALLOW_TF32=0 restricts F32 to FMA kernels
// (CUDNN_FMA_MATH: full F32 products, as on the CPU; the F32 tests need it).
//
// Algorithm choice, per key (device, dtype, direction, the shapes and strides of the three operands, layout,
// stride/padding/dilation/groups, pointer alignments, and the TF32/deterministic/benchmark switches):
//   default     cuDNN's heuristics (cudnnGet*Algorithm_v7), in their order;
//   benchmark   (cuda::set_cudnn_benchmark, AMPFORGE_CUDNN_BENCHMARK=1, as torch.backends.cudnn.benchmark)
//               cudnnFind*AlgorithmEx times every algorithm once on the call's own buffers, fastest first
//               (a backward-weight timing writes into a scratch gradient: the real one may hold earlier
//               chunks' sum), followed by the heuristics' list.
// The first candidate that is acceptable (status success; CUDNN_DETERMINISTIC when
// cuda::set_cudnn_deterministic / AMPFORGE_CUDNN_DETERMINISTIC=1 asks; never a conversion to a narrower
// type; for F32 without TF32 no tensor-core math), whose workspace is at most kMaxWorkspaceBytes and can be
// allocated, and that cuDNN accepts at launch is cached for the key: later calls skip the selection.
// A candidate refused at launch (CUDNN_STATUS_NOT_SUPPORTED*) or whose workspace cannot be allocated
// yields to the next one.
// Workspace: a Scratch from the device's caching allocator (runtime.h) for the call, on the compute
// stream, like the cuBLASLt workspace: a freed block is reused by later work in stream order.
// Bias: the output is pre-filled with the broadcast bias and the convolution accumulates into it
// (beta = 1), so the result is rounded once, as on the CPU and in linear. The fill runs after any
// benchmarking, which overwrites the output.
// Size limits: cuDNN descriptors take int dims and strides and tensors of at most 2^31 - 1 elements;
// larger batches run in chunks of whole images (the weight gradient sums the chunks with beta = 1).
// Handles: one cudnnHandle_t per device, created on first use and at the latest before a CUDA graph capture
// begins (prepare_cudnn, called by Graph::capture_begin: cudnnCreate must not run inside a capture), bound to
// the device's compute stream, never destroyed (as DeviceState). A handle must not be used by two threads at
// once: a per-device mutex serialises selection and launch (the launches are asynchronous: the lock is held
// for microseconds).
// CUDA graphs: a problem whose algorithm is cached runs inside a capture as anywhere else; benchmark mode
// cannot time algorithms inside one (cudnnFind runs and waits for kernels), so a problem first seen inside a
// capture with benchmark mode on is refused with an error that says what to do (run it once eagerly
// before the capture, as the trainer's warm-up steps do, or turn benchmark mode off).
// Retries in another layout (conv_layout_attempts, plan.h): a channels-last problem without a usable
// algorithm is retried in NCHW; a 16-bit NCHW one in channels-last (cuDNN's F16/BF16 tensor-core kernels are
// NHWC kernels). A heuristics query that answers CUDNN_STATUS_BAD_PARAM or NOT_SUPPORTED (cuDNN 9's legacy
// API does for some layouts) counts as "no algorithm" for that layout and takes the retry too.
//
// Without cuDNN at build time (AMPFORGE_WITH_CUDNN undefined, src/CMakeLists.txt) nothing is registered
// and conv2d on CUDA raises NotImplemented through dispatch; the switches below still exist.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(AMPFORGE_WITH_CUDNN)
#include <cudnn.h>
#endif

#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/backends/cuda/plan.h"
#include "ampforge/backends/cuda/register.h"
#include "ampforge/backends/cuda/runtime.h"
#include "ampforge/core/attrs.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/util/env.h"
#include "ampforge/util/error.h"
#include "ampforge/util/log.h"

namespace ampforge::cuda {

// ---- switches (cuda.h) --------------------------------------------------------------------------------

namespace {

// Read from the environment on first use, not during static initialisation (where a bad value could only
// terminate the process).
std::atomic<bool>& tf32_switch() {
  static std::atomic<bool> flag{env_flag("AMPFORGE_CUDNN_ALLOW_TF32", true)};
  return flag;
}
std::atomic<bool>& benchmark_switch() {
  static std::atomic<bool> flag{env_flag("AMPFORGE_CUDNN_BENCHMARK", false)};
  return flag;
}
std::atomic<bool>& deterministic_switch() {
  static std::atomic<bool> flag{env_flag("AMPFORGE_CUDNN_DETERMINISTIC", false)};
  return flag;
}

}  // namespace

void set_cudnn_allow_tf32(bool allow) { tf32_switch().store(allow, std::memory_order_relaxed); }
bool cudnn_allow_tf32() { return tf32_switch().load(std::memory_order_relaxed); }
void set_cudnn_benchmark(bool on) { benchmark_switch().store(on, std::memory_order_relaxed); }
bool cudnn_benchmark() { return benchmark_switch().load(std::memory_order_relaxed); }
void set_cudnn_deterministic(bool on) { deterministic_switch().store(on, std::memory_order_relaxed); }
bool cudnn_deterministic() { return deterministic_switch().load(std::memory_order_relaxed); }

#if defined(AMPFORGE_WITH_CUDNN)

namespace {

// Upper bound of one call's workspace. Algorithms that want more are skipped (the next candidate is
// usually within a few percent); FFT algorithms on large images are the ones that reach it.
constexpr size_t kMaxWorkspaceBytes = size_t{1} << 30;

enum class Direction : int { Forward = 0, BackwardData = 1, BackwardFilter = 2 };

const char* op_name(Direction d) {
  switch (d) {
    case Direction::Forward: return "conv2d";
    case Direction::BackwardData: return "conv2d_backward_input";
    case Direction::BackwardFilter: return "conv2d_backward_weight";
  }
  return "conv";
}

const char* launch_name(Direction d) {
  switch (d) {
    case Direction::Forward: return "cudnnConvolutionForward";
    case Direction::BackwardData: return "cudnnConvolutionBackwardData";
    case Direction::BackwardFilter: return "cudnnConvolutionBackwardFilter";
  }
  return "cudnnConvolution";
}

// ---- per-device state ---------------------------------------------------------------------------------

struct AlgoChoice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : k) h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
    return h;
  }
};

struct CudnnState {
  std::once_flag once;
  cudnnHandle_t handle = nullptr;
  std::mutex mu;  // guards the handle's use, `cache` and `finds`
  std::unordered_map<std::vector<int64_t>, AlgoChoice, KeyHash> cache;
  int64_t finds = 0;  // cudnnFind*AlgorithmEx runs (benchmark mode), for tests
};

std::vector<CudnnState>& cudnn_states() {
  static auto* states = new std::vector<CudnnState>(static_cast<size_t>(device_count()));
  return *states;
}

CudnnState& cudnn_state(int device) {
  auto& v = cudnn_states();
  AF_ASSERT(device >= 0 && static_cast<size_t>(device) < v.size(), "no cuDNN state for CUDA device {}", device);
  CudnnState& st = v[static_cast<size_t>(device)];
  std::call_once(st.once, [&] {
    AF_CHECK(!is_capturing(), "cuDNN on CUDA device {}: the handle would be created inside a CUDA graph capture; "
             "Graph::capture_begin prepares it (this is a bug in the caller's order of calls)", device);
    DeviceGuard guard(device);
    AF_CUDNN_CHECK(cudnnCreate(&st.handle));
    AF_CUDNN_CHECK(cudnnSetStream(st.handle, device_state(device).compute));
  });
  return st;
}

// ---- descriptors --------------------------------------------------------------------------------------

// Owners (destroyed at scope exit; destruction cannot fail for a valid descriptor and must not throw).
template <class T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
struct DescOwner {
  T d = nullptr;
  DescOwner() { AF_CUDNN_CHECK(Create(&d)); }
  ~DescOwner() {
    if (d) Destroy(d);
  }
  DescOwner(const DescOwner&) = delete;
  DescOwner& operator=(const DescOwner&) = delete;
};
using TensorDesc = DescOwner<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc = DescOwner<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc =
    DescOwner<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;

cudnnDataType_t data_type(DType d) {
  switch (d) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::F16: return CUDNN_DATA_HALF;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    default: break;
  }
  AF_THROW(NotImplemented, "conv2d on CUDA: dtype {} is not supported (F32, F16 and BF16 are)", dtype_name(d));
}

int to_int(int64_t v, const char* what, const char* op) {
  if (v > INT_MAX)
    AF_THROW(NotImplemented, "{} on CUDA: {} = {} does not fit cuDNN's int descriptors", op, what, v);
  return static_cast<int>(v);
}

// Largest power of two (<= 256) dividing the address: kernels choose vector widths from it.
int64_t alignment_of(const void* p) {
  const uint64_t bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)) | 256u;
  return static_cast<int64_t>(bits & (~bits + 1));
}

// One image operand of a call: images [n0, n0 + nb) of a tensor packed in the call's layout.
struct Image {
  int64_t dims[4] = {0, 0, 0, 0};     // N, C, H, W
  int64_t strides[4] = {0, 0, 0, 0};  // as described to cuDNN
  void* ptr = nullptr;
};

Image image_of(const Tensor& t, int64_t n0, int64_t nb, bool nhwc) {
  const int64_t C = t.size(1), H = t.size(2), W = t.size(3);
  const int64_t packed[4] = {C * H * W, nhwc ? 1 : H * W, nhwc ? W * C : W, nhwc ? C : 1};
  Image im;
  for (int i = 0; i < 4; ++i) {
    im.dims[i] = i == 0 ? nb : t.size(i);
    // a size-1 dim's stride addresses nothing: the packed one tells cuDNN the layout
    im.strides[i] = (t.size(i) == 1 || im.dims[i] == 1) ? packed[i] : t.stride(i);
    AF_ASSERT(im.strides[i] == packed[i], "conv2d on CUDA: tensor of shape {} strides {} is not packed {}",
              t.shape().str(), t.strides().str(), nhwc ? "channels-last" : "contiguous");
  }
  im.ptr = static_cast<char*>(t.data_ptr()) + n0 * packed[0] * t.element_size();
  return im;
}

// Everything a call hands to cuDNN.
struct Problem {
  Direction dir = Direction::Forward;
  int device = 0;
  DType dtype = DType::F32;
  bool nhwc = false;
  Image x, y;  // the input image (dx for backward data) and the output image (dy for the backward ops)
  int64_t w[4] = {0, 0, 0, 0};  // C_out, C/groups, kH, kW
  void* wptr = nullptr;         // the weight (dw for backward weight)
  const Conv2dAttrs* attrs = nullptr;
  bool tf32 = true, deterministic = false, benchmark = false;
};

std::vector<int64_t> key_of(const Problem& p) {
  std::vector<int64_t> k;
  k.reserve(48);
  k.insert(k.end(), {p.device, static_cast<int64_t>(p.dir), static_cast<int64_t>(p.dtype), p.nhwc, p.tf32,
                     p.deterministic, p.benchmark});
  for (const Image* im : {&p.x, &p.y}) {
    k.insert(k.end(), im->dims, im->dims + 4);
    k.insert(k.end(), im->strides, im->strides + 4);
  }
  k.insert(k.end(), p.w, p.w + 4);
  const Conv2dAttrs& a = *p.attrs;
  k.insert(k.end(), {a.stride[0], a.stride[1], a.padding[0], a.padding[1], a.dilation[0], a.dilation[1], a.groups});
  k.insert(k.end(), {alignment_of(p.x.ptr), alignment_of(p.y.ptr), alignment_of(p.wptr)});
  return k;
}

std::string describe_problem(const Problem& p) {
  const Conv2dAttrs& a = *p.attrs;
  auto dims = [](const int64_t* d) { return fmt::format("[{}, {}, {}, {}]", d[0], d[1], d[2], d[3]); };
  return fmt::format(
      "{} {}, input {}, weight {}, output {}, stride ({}, {}), padding ({}, {}), dilation ({}, {}), groups {}"
      "{}{}",
      dtype_name(p.dtype), p.nhwc ? "channels-last" : "NCHW", dims(p.x.dims), dims(p.w), dims(p.y.dims), a.stride[0],
      a.stride[1], a.padding[0], a.padding[1], a.dilation[0], a.dilation[1], a.groups,
      p.dtype == DType::F32 && !p.tf32 ? ", TF32 off" : "", p.deterministic ? ", deterministic" : "");
}

// The math type the descriptor starts with (see the file comment).
cudnnMathType_t base_math(const Problem& p) {
  if (p.dtype != DType::F32) return CUDNN_TENSOR_OP_MATH;
  return p.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

struct Descriptors {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
};

void set_image(cudnnTensorDescriptor_t d, cudnnDataType_t dt, const Image& im, const char* op) {
  AF_CUDNN_CHECK(cudnnSetTensor4dDescriptorEx(
      d, dt, to_int(im.dims[0], "batch", op), to_int(im.dims[1], "channels", op), to_int(im.dims[2], "height", op),
      to_int(im.dims[3], "width", op), to_int(im.strides[0], "batch stride", op),
      to_int(im.strides[1], "channel stride", op), to_int(im.strides[2], "row stride", op),
      to_int(im.strides[3], "column stride", op)));
}

void describe(const Problem& p, Descriptors& d) {
  const char* op = op_name(p.dir);
  const cudnnDataType_t dt = data_type(p.dtype);
  set_image(d.x.d, dt, p.x, op);
  set_image(d.y.d, dt, p.y, op);
  to_int(p.w[0] * p.w[1] * p.w[2] * p.w[3], "weight elements", op);
  AF_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d.w.d, dt, p.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                            to_int(p.w[0], "output channels", op), to_int(p.w[1], "channels", op),
                                            to_int(p.w[2], "kernel height", op), to_int(p.w[3], "kernel width", op)));
  const Conv2dAttrs& a = *p.attrs;
  AF_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      d.conv.d, to_int(a.padding[0], "padding", op), to_int(a.padding[1], "padding", op),
      to_int(a.stride[0], "stride", op), to_int(a.stride[1], "stride", op), to_int(a.dilation[0], "dilation", op),
      to_int(a.dilation[1], "dilation", op), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  AF_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d.conv.d, to_int(a.groups, "groups", op)));
  AF_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.d, base_math(p)));
}

// ---- algorithms -----------------------------------------------------------------------------------------

// One entry of a heuristics or benchmark list (the three directions' perf structs, unified).
struct Candidate {
  int algo = 0;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  size_t memory = 0;
  cudnnDeterminism_t determinism = CUDNN_NON_DETERMINISTIC;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

template <class Perf>
void collect(const std::vector<Perf>& r, int n, std::vector<Candidate>& out) {
  for (int i = 0; i < n && i < static_cast<int>(r.size()); ++i)
    out.push_back({static_cast<int>(r[i].algo), r[i].status, r[i].memory, r[i].determinism, r[i].mathType});
}

// Test hook (cuda.h): heuristics queries still to be answered CUDNN_STATUS_BAD_PARAM; layout retries so far.
std::atomic<int> g_forced_bad_param{0};
std::atomic<int64_t> g_layout_retries{0};

// Whether a heuristics status means "cuDNN has nothing for this problem in this layout" (retry another
// layout) rather than an error to report at once.
bool no_algorithm_status(cudnnStatus_t s) {
  return s == CUDNN_STATUS_BAD_PARAM || CUDNN_STATUS_CATEGORY(s) == CUDNN_STATUS_NOT_SUPPORTED;
}

// cuDNN's heuristics list, in its order. `status` receives the query's status: for a "no algorithm" status
// (no_algorithm_status) the list is empty; any other failure throws.
std::vector<Candidate> heuristics(cudnnHandle_t h, const Problem& p, const Descriptors& d,
                                  cudnnStatus_t* status = nullptr) {
  std::vector<Candidate> c;
  int max = 0, got = 0;
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  switch (p.dir) {
    case Direction::Forward: {
      AF_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> r(static_cast<size_t>(std::max(max, 1)));
      st = cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.d, d.w.d, d.conv.d, d.y.d, static_cast<int>(r.size()), &got,
                                                  r.data());
      if (st == CUDNN_STATUS_SUCCESS) collect(r, got, c);
      break;
    }
    case Direction::BackwardData: {
      AF_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> r(static_cast<size_t>(std::max(max, 1)));
      st = cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w.d, d.y.d, d.conv.d, d.x.d, static_cast<int>(r.size()),
                                                       &got, r.data());
      if (st == CUDNN_STATUS_SUCCESS) collect(r, got, c);
      break;
    }
    case Direction::BackwardFilter: {
      AF_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> r(static_cast<size_t>(std::max(max, 1)));
      st = cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x.d, d.y.d, d.conv.d, d.w.d, static_cast<int>(r.size()),
                                                         &got, r.data());
      if (st == CUDNN_STATUS_SUCCESS) collect(r, got, c);
      break;
    }
  }
  if (st == CUDNN_STATUS_SUCCESS && g_forced_bad_param.load(std::memory_order_relaxed) > 0 &&
      g_forced_bad_param.fetch_sub(1, std::memory_order_relaxed) > 0) {
    st = CUDNN_STATUS_BAD_PARAM;  // test hook: as cuDNN answers for a layout it has no kernels for
    c.clear();
  }
  if (status != nullptr) *status = st;
  if (st != CUDNN_STATUS_SUCCESS && !no_algorithm_status(st))
    throw_cudnn_error(st, "cudnnGetConvolution*Algorithm_v7", __FILE__, __LINE__);
  return c;
}

// cudnnFind*AlgorithmEx: runs and times the algorithms on the problem's buffers (the output is
// overwritten; `dw` replaces the weight gradient's pointer).
std::vector<Candidate> find(cudnnHandle_t h, const Problem& p, const Descriptors& d, void* ws, size_t ws_bytes,
                            void* dw) {
  std::vector<Candidate> c;
  int max = 0, got = 0;
  switch (p.dir) {
    case Direction::Forward: {
      AF_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> r(static_cast<size_t>(std::max(max, 1)));
      AF_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, d.x.d, p.x.ptr, d.w.d, p.wptr, d.conv.d, d.y.d, p.y.ptr,
                                                            static_cast<int>(r.size()), &got, r.data(), ws, ws_bytes));
      collect(r, got, c);
      break;
    }
    case Direction::BackwardData: {
      AF_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> r(static_cast<size_t>(std::max(max, 1)));
      AF_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w.d, p.wptr, d.y.d, p.y.ptr, d.conv.d, d.x.d,
                                                                 p.x.ptr, static_cast<int>(r.size()), &got, r.data(),
                                                                 ws, ws_bytes));
      collect(r, got, c);
      break;
    }
    case Direction::BackwardFilter: {
      AF_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> r(static_cast<size_t>(std::max(max, 1)));
      AF_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d.x.d, p.x.ptr, d.y.d, p.y.ptr, d.conv.d, d.w.d,
                                                                   dw, static_cast<int>(r.size()), &got, r.data(), ws,
                                                                   ws_bytes));
      collect(r, got, c);
      break;
    }
  }
  return c;
}

// Workspace of `algo` with the descriptor's current math type; a failure status means "not usable".
cudnnStatus_t workspace_size(cudnnHandle_t h, const Problem& p, const Descriptors& d, int algo, size_t* bytes) {
  switch (p.dir) {
    case Direction::Forward:
      return cudnnGetConvolutionForwardWorkspaceSize(h, d.x.d, d.w.d, d.conv.d, d.y.d,
                                                     static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
    case Direction::BackwardData:
      return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w.d, d.y.d, d.conv.d, d.x.d,
                                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
    case Direction::BackwardFilter:
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x.d, d.y.d, d.conv.d, d.w.d,
                                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

// Launches the convolution: output = 1 * conv + beta * output.
cudnnStatus_t launch(cudnnHandle_t h, const Problem& p, const Descriptors& d, int algo, void* ws, size_t ws_bytes,
                     float beta) {
  const float alpha = 1.0f;  // float scaling factors for float, half and bfloat16 data
  switch (p.dir) {
    case Direction::Forward:
      return cudnnConvolutionForward(h, &alpha, d.x.d, p.x.ptr, d.w.d, p.wptr, d.conv.d,
                                     static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws, ws_bytes, &beta, d.y.d, p.y.ptr);
    case Direction::BackwardData:
      return cudnnConvolutionBackwardData(h, &alpha, d.w.d, p.wptr, d.y.d, p.y.ptr, d.conv.d,
                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ws, ws_bytes, &beta, d.x.d,
                                          p.x.ptr);
    case Direction::BackwardFilter:
      return cudnnConvolutionBackwardFilter(h, &alpha, d.x.d, p.x.ptr, d.y.d, p.y.ptr, d.conv.d,
                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), ws, ws_bytes, &beta,
                                            d.w.d, p.wptr);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

bool acceptable(const Problem& p, const Candidate& c) {
  if (c.status != CUDNN_STATUS_SUCCESS) return false;
  if (p.deterministic && c.determinism != CUDNN_DETERMINISTIC) return false;
  if (c.math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;  // would round operands to a narrower type
  if (p.dtype == DType::F32 && !p.tf32 && c.math == CUDNN_TENSOR_OP_MATH) return false;
  return true;
}

// The math type a candidate runs with: its own, except that F32 without TF32 always runs FMA-only.
cudnnMathType_t run_math(const Problem& p, const Candidate& c) {
  return p.dtype == DType::F32 && !p.tf32 ? CUDNN_FMA_MATH : c.math;
}

bool is_out_of_memory(const Error& e) { return e.kind() == ErrorKind::OutOfMemory; }

// Benchmark mode: times the algorithms with a workspace as large as the largest heuristic candidate
// within kMaxWorkspaceBytes (halved until the allocator can give it).
std::vector<Candidate> benchmark(CudnnState& st, const Problem& p, const Descriptors& d) {
  if (is_capturing())
    AF_THROW(InvalidArgument,
             "{} on CUDA: cuDNN benchmark mode cannot time algorithms inside a CUDA graph capture ({} is seen for the "
             "first time here). Run the captured code once eagerly before capture_begin() so that the choice is "
             "cached (the trainer's warm-up steps do), or turn benchmark mode off (cuda::set_cudnn_benchmark(false), "
             "AMPFORGE_CUDNN_BENCHMARK=0)",
             op_name(p.dir), describe_problem(p));
  size_t want = 0;
  for (const Candidate& c : heuristics(st.handle, p, d))
    if (c.status == CUDNN_STATUS_SUCCESS && c.memory <= kMaxWorkspaceBytes) want = std::max(want, c.memory);
  std::optional<Scratch> ws;
  while (!ws) {
    try {
      ws.emplace(p.device, want);
    } catch (const Error& e) {
      if (!is_out_of_memory(e) || want == 0) throw;
      want /= 2;
    }
  }
  std::optional<Scratch> dw;
  if (p.dir == Direction::BackwardFilter)
    dw.emplace(p.device, static_cast<size_t>(p.w[0] * p.w[1] * p.w[2] * p.w[3] * dtype_size(p.dtype)));
  ++st.finds;
  count_host_sync();  // cudnnFind*AlgorithmEx times the algorithms: it waits for the device
  return find(st.handle, p, d, ws->get(), want, dw ? dw->get() : p.wptr);
}

// Runs p's convolution with the cached algorithm for its key, or selects one (file comment) and caches
// it. `before` (may be empty) runs right before the convolution: after any benchmarking, which
// overwrites the output.
void run(const Problem& p, float beta, const std::function<void()>& before) {
  CudnnState& st = cudnn_state(p.device);
  Descriptors d;
  describe(p, d);
  const std::vector<int64_t> key = key_of(p);
  std::lock_guard<std::mutex> lock(st.mu);
  if (auto it = st.cache.find(key); it != st.cache.end()) {
    const AlgoChoice c = it->second;
    AF_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.d, c.math));
    Scratch ws(p.device, c.workspace);
    if (before) before();
    const cudnnStatus_t s = launch(st.handle, p, d, c.algo, ws.get(), c.workspace, beta);
    if (s != CUDNN_STATUS_SUCCESS) throw_cudnn_error(s, launch_name(p.dir), __FILE__, __LINE__);
    return;
  }

  std::vector<Candidate> candidates;
  if (p.benchmark) candidates = benchmark(st, p, d);
  cudnnStatus_t hs = CUDNN_STATUS_SUCCESS;
  for (const Candidate& c : heuristics(st.handle, p, d, &hs)) candidates.push_back(c);
  std::string skipped;
  if (hs != CUDNN_STATUS_SUCCESS) skipped += fmt::format("; the heuristics query answered {}", cudnnGetErrorString(hs));
  bool before_done = false;
  for (const Candidate& c : candidates) {
    if (!acceptable(p, c)) continue;
    const cudnnMathType_t math = run_math(p, c);
    AF_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.d, math));
    size_t bytes = 0;
    if (workspace_size(st.handle, p, d, c.algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;
    if (bytes > kMaxWorkspaceBytes) {
      skipped += fmt::format("; algorithm {} wants {} MiB of workspace", c.algo, bytes >> 20);
      continue;
    }
    std::optional<Scratch> ws;
    try {
      ws.emplace(p.device, bytes);
    } catch (const Error& e) {
      if (!is_out_of_memory(e)) throw;
      skipped += fmt::format("; algorithm {}: no memory for its {} MiB workspace", c.algo, bytes >> 20);
      continue;
    }
    if (before && !before_done) {
      before();
      before_done = true;
    }
    const cudnnStatus_t s = launch(st.handle, p, d, c.algo, ws->get(), bytes, beta);
    if (s == CUDNN_STATUS_SUCCESS) {
      st.cache.emplace(key, AlgoChoice{c.algo, math, bytes});
      return;
    }
    if (CUDNN_STATUS_CATEGORY(s) != CUDNN_STATUS_NOT_SUPPORTED)
      throw_cudnn_error(s, launch_name(p.dir), __FILE__, __LINE__);
    skipped += fmt::format("; algorithm {}: {}", c.algo, cudnnGetErrorString(s));
  }
  AF_THROW(NotImplemented, "{} on CUDA: cuDNN {} offers no usable algorithm for {} ({} candidates{}{})", op_name(p.dir),
           cudnnGetVersion(), describe_problem(p), candidates.size(),
           p.deterministic ? ", deterministic ones only" : "", skipped);
}

// ---- the kernels ----------------------------------------------------------------------------------------

bool channels_last(const Tensor& t) { return t.suggest_memory_format() == MemoryFormat::ChannelsLast; }

MemoryFormat format_of(bool nhwc) { return nhwc ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous; }

// An input packed in the call's layout: itself, or a copy.
Tensor input_in(const Tensor& t, bool nhwc) {
  if (t.is_contiguous(format_of(nhwc))) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device(), format_of(nhwc));
  copy_on_device(c, t);
  return c;
}

// Where an output is computed: itself when packed in the call's layout, else a temporary that is copied
// into it afterwards (finish_output).
Tensor output_in(const Tensor& t, bool nhwc) {
  if (t.is_contiguous(format_of(nhwc))) return t;
  return Tensor::empty(t.shape(), t.dtype(), t.device(), format_of(nhwc));
}

void finish_output(const Tensor& out, const Tensor& computed) {
  if (!computed.is_same(out)) copy_on_device(out, computed);
}

// Images [n0, n0 + nb) of a packed image tensor, as a tensor.
Tensor images(const Tensor& t, int64_t n0, int64_t nb) {
  Shape s = t.shape();
  s[0] = nb;
  return t.as_strided_raw(s, t.strides(), t.offset() + n0 * t.size(1) * t.size(2) * t.size(3));
}

// Images per cuDNN call: every image tensor of a call must stay below 2^31 elements.
int64_t images_per_call(const char* op, int64_t N, const Tensor& a, const Tensor& b) {
  const int64_t per = std::max(a.size(1) * a.size(2) * a.size(3), b.size(1) * b.size(2) * b.size(3));
  if (per > INT_MAX)
    AF_THROW(NotImplemented, "{} on CUDA: one image of {} elements exceeds cuDNN's limit of 2^31 - 1 elements", op,
             per);
  return std::max<int64_t>(1, std::min<int64_t>(N, INT_MAX / std::max<int64_t>(per, 1)));
}

Problem make_problem(Direction dir, const Tensor& x, const Tensor& w, const Tensor& y, int64_t n0, int64_t nb,
                     bool nhwc, const Conv2dAttrs& a) {
  Problem p;
  p.dir = dir;
  p.device = y.device().index;
  p.dtype = y.dtype();
  p.nhwc = nhwc;
  p.x = image_of(x, n0, nb, nhwc);
  p.y = image_of(y, n0, nb, nhwc);
  for (int i = 0; i < 4; ++i) p.w[i] = w.size(i);
  p.wptr = w.data_ptr();
  p.attrs = &a;
  p.tf32 = cudnn_allow_tf32();
  p.deterministic = cudnn_deterministic();
  p.benchmark = cudnn_benchmark();
  return p;
}

// Runs body(nhwc) in the layouts of conv_layout_attempts (plan.h), in order, until one is served; a
// NotImplemented from the last one propagates, naming every layout tried.
template <class F>
void in_layout(const char* op, bool nhwc, DType dtype, F&& body) {
  const std::vector<bool> layouts = conv_layout_attempts(nhwc, dtype == DType::F16 || dtype == DType::BF16);
  std::string tried;
  for (size_t i = 0; i < layouts.size(); ++i) {
    try {
      body(layouts[i]);
      return;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::NotImplemented || (i + 1 == layouts.size() && tried.empty())) throw;
      if (i + 1 == layouts.size()) AF_THROW(NotImplemented, "{}{}", e.what(), tried);
      tried += fmt::format(" (also tried {}: {})", layouts[i] ? "channels-last" : "NCHW", e.what());
      g_layout_retries.fetch_add(1, std::memory_order_relaxed);
      log(LogLevel::Debug, "{} on CUDA: retrying in {} after: {}", op, layouts[i + 1] ? "channels-last" : "NCHW",
          e.what());
    }
  }
}

// inputs: x, weight[, bias]; outputs: y.
void conv2d_cuda(const KernelArgs& k) {
  const Tensor &x0 = k.in(0), &w0 = k.in(1), &out = k.out(0);
  const Tensor* bias = k.inputs.size() > 2 && k.in(2).defined() ? &k.in(2) : nullptr;
  const Conv2dAttrs& a = k.attr<Conv2dAttrs>();
  (void)data_type(out.dtype());  // throws for dtypes cuDNN is not used for
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device());
  in_layout("conv2d", channels_last(out), out.dtype(), [&](bool nhwc) {
    const Tensor x = input_in(x0, nhwc), w = input_in(w0, nhwc), y = output_in(out, nhwc);
    const int64_t N = x.size(0), step = images_per_call("conv2d", N, x, y);
    Tensor bview;
    if (bias)  // (C_out) as (1, C_out, 1, 1), broadcast over the images by the copy
      bview = bias->as_strided_raw(Shape{1, bias->size(0), 1, 1}, Strides{0, bias->stride(0), 0, 0}, bias->offset());
    for (int64_t n0 = 0; n0 < N; n0 += step) {
      const int64_t nb = std::min(step, N - n0);
      std::function<void()> fill_bias;
      if (bias) fill_bias = [&] { copy_on_device(images(y, n0, nb), bview); };
      run(make_problem(Direction::Forward, x, w, y, n0, nb, nhwc, a), bias ? 1.0f : 0.0f, fill_bias);
    }
    finish_output(out, y);
  });
}

// inputs: grad_out, weight; outputs: grad_in.
void conv2d_backward_input_cuda(const KernelArgs& k) {
  const Tensor &gy0 = k.in(0), &w0 = k.in(1), &gin = k.out(0);
  const Conv2dAttrs& a = k.attr<Conv2dAttrs>();
  (void)data_type(gin.dtype());
  if (gin.numel() == 0) return;
  DeviceGuard guard(gin.device());
  in_layout("conv2d_backward_input", channels_last(gin), gin.dtype(), [&](bool nhwc) {
    const Tensor gy = input_in(gy0, nhwc), w = input_in(w0, nhwc), gx = output_in(gin, nhwc);
    const int64_t N = gx.size(0), step = images_per_call("conv2d_backward_input", N, gx, gy);
    for (int64_t n0 = 0; n0 < N; n0 += step)
      run(make_problem(Direction::BackwardData, gx, w, gy, n0, std::min(step, N - n0), nhwc, a), 0.0f, {});
    finish_output(gin, gx);
  });
}

// inputs: grad_out, x; outputs: grad_weight.
void conv2d_backward_weight_cuda(const KernelArgs& k) {
  const Tensor &gy0 = k.in(0), &x0 = k.in(1), &gw0 = k.out(0);
  const Conv2dAttrs& a = k.attr<Conv2dAttrs>();
  (void)data_type(gw0.dtype());
  if (gw0.numel() == 0) return;
  DeviceGuard guard(gw0.device());
  if (x0.size(0) == 0) {  // no images: the sum over them is zero
    fill_on_device(gw0, 0.0);
    return;
  }
  in_layout("conv2d_backward_weight", channels_last(gy0) || channels_last(x0), gw0.dtype(), [&](bool nhwc) {
    const Tensor gy = input_in(gy0, nhwc), x = input_in(x0, nhwc), gw = output_in(gw0, nhwc);
    const int64_t N = x.size(0), step = images_per_call("conv2d_backward_weight", N, x, gy);
    for (int64_t n0 = 0; n0 < N; n0 += step)  // chunks after the first add into the gradient
      run(make_problem(Direction::BackwardFilter, x, gw, gy, n0, std::min(step, N - n0), nhwc, a),
          n0 == 0 ? 0.0f : 1.0f, {});
    finish_output(gw0, gw);
  });
}

}  // namespace

int64_t cudnn_version() { return static_cast<int64_t>(cudnnGetVersion()); }

void prepare_cudnn(int device) {
  // A graph without convolutions must not fail because cuDNN cannot start (a library missing at run time):
  // say so here; a convolution inside the capture then fails with the handle's own error.
  try {
    cudnn_state(device);
  } catch (const Error& e) {
    log(LogLevel::Warn, "cuDNN could not be prepared before the CUDA graph capture: {}", e.what());
  }
}
void set_cudnn_heuristic_bad_param_for_testing(int calls) { g_forced_bad_param.store(calls, std::memory_order_relaxed); }
int64_t cudnn_layout_retries() { return g_layout_retries.load(std::memory_order_relaxed); }

int64_t cudnn_cache_size() {
  int64_t n = 0;
  for (CudnnState& s : cudnn_states()) {
    std::lock_guard<std::mutex> lock(s.mu);
    n += static_cast<int64_t>(s.cache.size());
  }
  return n;
}

int64_t cudnn_benchmark_runs() {
  int64_t n = 0;
  for (CudnnState& s : cudnn_states()) {
    std::lock_guard<std::mutex> lock(s.mu);
    n += s.finds;
  }
  return n;
}

void register_conv_cuda() {
  register_kernel(OpId::conv2d, DeviceType::CUDA, conv2d_cuda);
  register_kernel(OpId::conv2d_backward_input, DeviceType::CUDA, conv2d_backward_input_cuda);
  register_kernel(OpId::conv2d_backward_weight, DeviceType::CUDA, conv2d_backward_weight_cuda);
}

#else  // !AMPFORGE_WITH_CUDNN

int64_t cudnn_version() { return 0; }
int64_t cudnn_cache_size() { return 0; }
int64_t cudnn_benchmark_runs() { return 0; }
void prepare_cudnn(int) {}
void set_cudnn_heuristic_bad_param_for_testing(int) {}
int64_t cudnn_layout_retries() { return 0; }

void register_conv_cuda() {
  log(LogLevel::Debug, "conv2d has no CUDA kernel: this build has no cuDNN (cudnn.h/libcudnn were not found)");
}

#endif  // AMPFORGE_WITH_CUDNN

}  // namespace ampforge::cuda
