// NCCL through dlopen. The types and constants below are NCCL's and the driver's ABI (nccl.h, cuda.h),
// declared here so that this file needs neither header; when the build finds nccl.h (the CUDA toolkit
// ships it), they are checked against it at compile time.
#include "ampforge/dist/nccl_communicator.h"

#include <dlfcn.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "ampforge/dist/watchdog.h"
#include "ampforge/util/env.h"
#include "ampforge/util/error.h"

#if defined(AMPFORGE_HAVE_NCCL_H)
#include <nccl.h>
#endif

namespace ampforge::dist {

namespace {

// ---- ABI --------------------------------------------------------------------------------------------------
using nccl_result = int;    // ncclResult_t
using nccl_comm = void*;    // ncclComm_t
using cu_result = int;      // CUresult
using cu_stream = void*;    // CUstream == cudaStream_t
using cu_event = void*;     // CUevent
using cu_context = void*;   // CUcontext
using cu_device = int;      // CUdevice
using cu_ptr = unsigned long long;  // CUdeviceptr
struct nccl_unique_id {
  char internal[128];
};
constexpr int kNcclUint8 = 1, kNcclInt32 = 2, kNcclInt64 = 4, kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclFloat64 = 8,
              kNcclBfloat16 = 9;                                   // ncclDataType_t
constexpr int kNcclSum = 0, kNcclMax = 2, kNcclAvg = 4;           // ncclRedOp_t
constexpr nccl_result kNcclInProgress = 7;                         // a non-blocking communicator's pending state
constexpr int kCuStreamNonBlocking = 0x1, kCuEventDisableTiming = 0x2, kCuErrorNotReady = 600;

#if defined(AMPFORGE_HAVE_NCCL_H)
static_assert(sizeof(nccl_unique_id) == sizeof(ncclUniqueId));
static_assert(kNcclUint8 == int{ncclUint8} && kNcclInt32 == int{ncclInt32} && kNcclInt64 == int{ncclInt64} &&
              kNcclFloat16 == int{ncclFloat16} && kNcclFloat32 == int{ncclFloat32} &&
              kNcclFloat64 == int{ncclFloat64});
static_assert(kNcclSum == int{ncclSum} && kNcclMax == int{ncclMax} && kNcclAvg == int{ncclAvg});
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
static_assert(kNcclInProgress == int{ncclInProgress});
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
static_assert(kNcclBfloat16 == int{ncclBfloat16});
#endif
#endif

struct Nccl {
  nccl_result (*GetVersion)(int*) = nullptr;
  nccl_result (*GetUniqueId)(nccl_unique_id*) = nullptr;
  nccl_result (*CommInitRank)(nccl_comm*, int, nccl_unique_id, int) = nullptr;
  nccl_result (*CommDestroy)(nccl_comm) = nullptr;
  nccl_result (*CommAbort)(nccl_comm) = nullptr;
  nccl_result (*CommGetAsyncError)(nccl_comm, nccl_result*) = nullptr;
  nccl_result (*AllReduce)(const void*, void*, size_t, int, int, nccl_comm, cu_stream) = nullptr;
  nccl_result (*Broadcast)(const void*, void*, size_t, int, int, nccl_comm, cu_stream) = nullptr;
  nccl_result (*ReduceScatter)(const void*, void*, size_t, int, int, nccl_comm, cu_stream) = nullptr;
  nccl_result (*AllGather)(const void*, void*, size_t, int, nccl_comm, cu_stream) = nullptr;
  const char* (*GetErrorString)(nccl_result) = nullptr;
  const char* (*GetLastError)(nccl_comm) = nullptr;  // NCCL >= 2.13; optional
  // CUDA driver
  cu_result (*Init)(unsigned) = nullptr;
  cu_result (*DeviceGet)(cu_device*, int) = nullptr;
  cu_result (*PrimaryCtxRetain)(cu_context*, cu_device) = nullptr;
  cu_result (*PrimaryCtxRelease)(cu_device) = nullptr;
  cu_result (*CtxSetCurrent)(cu_context) = nullptr;
  cu_result (*StreamCreate)(cu_stream*, unsigned) = nullptr;
  cu_result (*StreamDestroy)(cu_stream) = nullptr;
  cu_result (*StreamSynchronize)(cu_stream) = nullptr;
  cu_result (*StreamWaitEvent)(cu_stream, cu_event, unsigned) = nullptr;
  cu_result (*EventCreate)(cu_event*, unsigned) = nullptr;
  cu_result (*EventRecord)(cu_event, cu_stream) = nullptr;
  cu_result (*EventQuery)(cu_event) = nullptr;
  cu_result (*EventDestroy)(cu_event) = nullptr;
  cu_result (*MemAlloc)(cu_ptr*, size_t) = nullptr;
  cu_result (*MemFree)(cu_ptr) = nullptr;
  cu_result (*MemcpyHtoDAsync)(cu_ptr, const void*, size_t, cu_stream) = nullptr;
  cu_result (*MemcpyDtoHAsync)(void*, cu_ptr, size_t, cu_stream) = nullptr;
  cu_result (*GetErrorName)(cu_result, const char**) = nullptr;
  NcclStatus status;
};

template <class F>
bool load_symbol(void* lib, const char* name, F& fn, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr && missing.empty()) missing = name;
  return fn != nullptr;
}

Nccl& nccl() {
  static Nccl n;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> names{"libnccl.so.2", "libnccl.so"};
    if (auto p = env_get("AMPFORGE_NCCL_LIBRARY"); p && !p->empty()) names = {*p};
    void* lib = nullptr;
    std::string errors;
    for (const std::string& name : names) {
      lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) {
        n.status.library = name;
        break;
      }
      const char* e = dlerror();
      errors += fmt::format("{}{}", errors.empty() ? "" : "; ", e ? e : name);
    }
    if (lib == nullptr) {
      n.status.reason = "NCCL could not be loaded (" + errors + "); set AMPFORGE_NCCL_LIBRARY to libnccl.so.2's path";
      return;
    }
    std::string missing;
    load_symbol(lib, "ncclGetVersion", n.GetVersion, missing);
    load_symbol(lib, "ncclGetUniqueId", n.GetUniqueId, missing);
    load_symbol(lib, "ncclCommInitRank", n.CommInitRank, missing);
    load_symbol(lib, "ncclCommDestroy", n.CommDestroy, missing);
    load_symbol(lib, "ncclCommAbort", n.CommAbort, missing);
    load_symbol(lib, "ncclCommGetAsyncError", n.CommGetAsyncError, missing);
    load_symbol(lib, "ncclAllReduce", n.AllReduce, missing);
    load_symbol(lib, "ncclBroadcast", n.Broadcast, missing);
    load_symbol(lib, "ncclReduceScatter", n.ReduceScatter, missing);
    load_symbol(lib, "ncclAllGather", n.AllGather, missing);
    load_symbol(lib, "ncclGetErrorString", n.GetErrorString, missing);
    if (!missing.empty()) {
      n.status.reason = fmt::format("{} lacks {}", n.status.library, missing);
      return;
    }
    n.GetLastError = reinterpret_cast<decltype(n.GetLastError)>(dlsym(lib, "ncclGetLastError"));
    int v = 0;
    n.GetVersion(&v);
    // NCCL_VERSION_CODE: 10000 major + 100 minor + patch from 2.9 on.
    n.status.version = v >= 20900 ? fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100) : std::to_string(v);
    if (v < 21000) {  // ncclAvg and ncclBfloat16 arrived in 2.10
      n.status.reason = fmt::format("NCCL {} is too old: ampforge needs 2.10 or later (ncclAvg, bfloat16)",
                                    n.status.version);
      return;
    }
    // AMPFORGE_CUDA_DRIVER_LIBRARY: another driver library file (the tests' fake, tests/fake_nccl/).
    std::string driver = "libcuda.so.1";
    if (auto p = env_get("AMPFORGE_CUDA_DRIVER_LIBRARY"); p && !p->empty()) driver = *p;
    void* cu = dlopen(driver.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (cu == nullptr) {
      n.status.reason = fmt::format("the NVIDIA driver library {} could not be loaded (no driver installed?)", driver);
      return;
    }
    load_symbol(cu, "cuInit", n.Init, missing);
    load_symbol(cu, "cuDeviceGet", n.DeviceGet, missing);
    load_symbol(cu, "cuDevicePrimaryCtxRetain", n.PrimaryCtxRetain, missing);
    load_symbol(cu, "cuDevicePrimaryCtxRelease_v2", n.PrimaryCtxRelease, missing);
    load_symbol(cu, "cuCtxSetCurrent", n.CtxSetCurrent, missing);
    load_symbol(cu, "cuStreamCreate", n.StreamCreate, missing);
    load_symbol(cu, "cuStreamDestroy_v2", n.StreamDestroy, missing);
    load_symbol(cu, "cuStreamSynchronize", n.StreamSynchronize, missing);
    load_symbol(cu, "cuStreamWaitEvent", n.StreamWaitEvent, missing);
    load_symbol(cu, "cuEventCreate", n.EventCreate, missing);
    load_symbol(cu, "cuEventRecord", n.EventRecord, missing);
    load_symbol(cu, "cuEventQuery", n.EventQuery, missing);
    load_symbol(cu, "cuEventDestroy_v2", n.EventDestroy, missing);
    load_symbol(cu, "cuMemAlloc_v2", n.MemAlloc, missing);
    load_symbol(cu, "cuMemFree_v2", n.MemFree, missing);
    load_symbol(cu, "cuMemcpyHtoDAsync_v2", n.MemcpyHtoDAsync, missing);
    load_symbol(cu, "cuMemcpyDtoHAsync_v2", n.MemcpyDtoHAsync, missing);
    load_symbol(cu, "cuGetErrorName", n.GetErrorName, missing);
    if (!missing.empty()) {
      n.status.reason = driver + " lacks " + missing;
      return;
    }
    if (const cu_result r = n.Init(0); r != 0) {
      n.status.reason = fmt::format("cuInit failed (CUresult {}): no GPU visible?", r);
      return;
    }
    n.status.available = true;
  });
  return n;
}

std::string cu_text(cu_result r) {
  const char* s = nullptr;
  if (nccl().GetErrorName) nccl().GetErrorName(r, &s);
  return s ? s : fmt::format("CUresult {}", r);
}

#define AF_CU(call)                                                                       \
  do {                                                                                    \
    const cu_result af_cu_rc_ = (call);                                                   \
    if (af_cu_rc_ != 0) AF_THROW(Internal, "{} failed: {}", #call, cu_text(af_cu_rc_));   \
  } while (0)

int nccl_dtype(DType d) {
  switch (d) {
    case DType::F32: return kNcclFloat32;
    case DType::F16: return kNcclFloat16;
    case DType::BF16: return kNcclBfloat16;
    case DType::F64: return kNcclFloat64;
    case DType::I32: return kNcclInt32;
    case DType::I64: return kNcclInt64;
    default: return kNcclUint8;
  }
}
int nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? kNcclSum : op == ReduceOp::Max ? kNcclMax : kNcclAvg; }

class NcclWork final : public Work {
 public:
  NcclWork(cu_event done, cu_stream compute, std::vector<Tensor> keep)
      : done_(done), compute_(compute), keep_(std::move(keep)) {}
  ~NcclWork() override {
    try {
      wait();
    } catch (...) {
    }
    if (done_ != nullptr) nccl().EventDestroy(done_);  // released by the driver once the event has completed
  }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    AF_CU(nccl().StreamWaitEvent(compute_, done_, 0));
    keep_.clear();  // the compute stream is now ordered after the collective
  }
  bool is_completed() override {
    const cu_result r = nccl().EventQuery(done_);
    if (r == kCuErrorNotReady) return false;
    AF_CU(r);
    return true;
  }

 private:
  cu_event done_;
  cu_stream compute_;
  std::vector<Tensor> keep_;
  bool waited_ = false;
};

// The watchdog (watchdog.h) watches every collective through a second event recorded after it, and NCCL's
// asynchronous error; it aborts the communicator on a failure or timeout.
class NcclCommunicator final : public Communicator, private WatchdogBackend {
 public:
  NcclCommunicator(const NcclOptions& o) : Communicator(o.rank, o.size), o_(o) {
    Nccl& n = nccl();
    AF_CU(n.DeviceGet(&dev_, o.device));
    AF_CU(n.PrimaryCtxRetain(&ctx_, dev_));
    try {
      init(o);
    } catch (...) {
      release_resources();  // a destructor does not run for a constructor that throws
      throw;
    }
  }
  ~NcclCommunicator() override {
    watchdog_.reset();  // first: its thread uses the communicator and the context
    release_resources();
  }
  const char* backend() const override { return "nccl"; }
  Device device() const override { return Device(DeviceType::CUDA, o_.device); }
  double collective_timeout() const override { return watchdog_->timeout(); }
  void set_collective_timeout(double seconds) override { watchdog_->set_timeout(seconds); }

 private:
  void init(const NcclOptions& o) {
    Nccl& n = nccl();
    AF_CU(n.CtxSetCurrent(ctx_));
    compute_ = reinterpret_cast<cu_stream>(o.compute_stream);
    AF_CU(n.StreamCreate(&stream_, kCuStreamNonBlocking));
    NcclUniqueId id{};
    nccl_unique_id uid{};
    if (o.rank == 0) {
      check(n.GetUniqueId(&uid), "ncclGetUniqueId");
      std::copy(uid.internal, uid.internal + 128, id.begin());
    }
    o.share_id(id);
    std::copy(id.begin(), id.end(), uid.internal);
    nccl_comm comm = nullptr;  // only a communicator that initialised is kept (and destroyed later)
    check(n.CommInitRank(&comm, o.size, uid, o.rank), "ncclCommInitRank");
    comm_ = comm;
    WatchdogOptions wo;
    wo.timeout_s = o.collective_timeout_s;
    wo.where = fmt::format("rank {} (cuda:{})", o.rank, o.device);
    watchdog_ = std::make_unique<CollectiveWatchdog>(static_cast<WatchdogBackend&>(*this), std::move(wo));
  }
  void release_resources() {
    Nccl& n = nccl();
    if (scratch_ != 0) n.MemFree(scratch_);
    if (comm_ != nullptr && !aborted_) n.CommDestroy(comm_);  // ncclCommAbort has freed an aborted one
    if (stream_ != nullptr) n.StreamDestroy(stream_);
    if (ctx_ != nullptr) n.PrimaryCtxRelease(dev_);
    scratch_ = 0, comm_ = nullptr, stream_ = nullptr, ctx_ = nullptr;
  }

 public:
  WorkPtr all_reduce(const Tensor& t, ReduceOp op) override {
    check_tensor(t, "all_reduce");
    check_reducible(t, "all_reduce");
    cu_stream s = begin();
    check(nccl().AllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_dtype(t.dtype()),
                           nccl_op(op), comm_, s), "ncclAllReduce");
    return end({t}, "ncclAllReduce", t.nbytes());
  }
  WorkPtr broadcast(const Tensor& t, int root) override {
    check_tensor(t, "broadcast");
    AF_CHECK(root >= 0 && root < size(), "broadcast (nccl): root {} is not a rank of a world of {}", root, size());
    cu_stream s = begin();
    check(nccl().Broadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.nbytes()), kNcclUint8, root, comm_, s),
          "ncclBroadcast");
    return end({t}, "ncclBroadcast", t.nbytes());
  }
  WorkPtr reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    check_tensor(in, "reduce_scatter input", true);
    check_tensor(out, "reduce_scatter output", true);
    check_reducible(in, "reduce_scatter");
    AF_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() * size(), "reduce_scatter (nccl): input {} x {}, "
             "output {} x {}: expected the same dtype and input = world {} x output", in.numel(),
             dtype_name(in.dtype()), out.numel(), dtype_name(out.dtype()), size());
    cu_stream s = begin();
    check(nccl().ReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()), nccl_dtype(in.dtype()),
                               nccl_op(op), comm_, s), "ncclReduceScatter");
    return end({in, out}, "ncclReduceScatter", in.nbytes());
  }
  WorkPtr all_gather(const Tensor& in, const Tensor& out) override {
    check_tensor(in, "all_gather input", true);
    check_tensor(out, "all_gather output", true);
    AF_CHECK(in.dtype() == out.dtype() && out.numel() == in.numel() * size(), "all_gather (nccl): input {} x {}, "
             "output {} x {}: expected the same dtype and output = world {} x input", in.numel(),
             dtype_name(in.dtype()), out.numel(), dtype_name(out.dtype()), size());
    cu_stream s = begin();
    check(nccl().AllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.nbytes()), kNcclUint8, comm_, s),
          "ncclAllGather");
    return end({in, out}, "ncclAllGather", out.nbytes());
  }
  void barrier() override {
    const uint8_t one = 1;
    std::vector<uint8_t> out(static_cast<size_t>(size()));
    host_all_gather(&one, 1, out.data());
  }

 protected:
  void host_all_gather(const void* in, size_t bytes, void* out) override {
    Nccl& n = nccl();
    AF_CU(n.CtxSetCurrent(ctx_));
    const size_t need = bytes * (static_cast<size_t>(size()) + 1);
    if (need > scratch_bytes_) {
      if (scratch_ != 0) AF_CU(n.MemFree(scratch_));
      scratch_ = 0;
      AF_CU(n.MemAlloc(&scratch_, need));
      scratch_bytes_ = need;
    }
    // The compute stream may still be writing what the caller read before: order after it first.
    cu_stream s = begin();
    AF_CU(n.StreamSynchronize(s));
    // Both copies on the NCCL stream, in its order. A plain cuMemcpyHtoD runs on the legacy default stream,
    // which the non-blocking NCCL stream does not wait for, and from pageable memory it may return before
    // the bytes reach the device (CUDA's "API synchronization behavior"): the all-gather could read stale ones.
    AF_CU(n.MemcpyHtoDAsync(scratch_, in, bytes, s));
    check(n.AllGather(reinterpret_cast<void*>(scratch_), reinterpret_cast<void*>(scratch_ + bytes), bytes, kNcclUint8,
                      comm_, s), "ncclAllGather");
    watch("ncclAllGather of host values", bytes * static_cast<size_t>(size()));
    AF_CU(n.MemcpyDtoHAsync(out, scratch_ + bytes, bytes * static_cast<size_t>(size()), s));
    // A rank that stopped taking part blocks this wait until the watchdog aborts the communicator; what was
    // gathered is then garbage, and the check says why.
    const cu_result synced = n.StreamSynchronize(s);
    watchdog_->check();
    if (synced != 0) AF_THROW(Internal, "cuStreamSynchronize after ncclAllGather failed: {}", cu_text(synced));
  }

 private:
  void check(nccl_result r, const char* what) {
    if (r == 0) return;
    Nccl& n = nccl();
    const char* last = n.GetLastError != nullptr ? n.GetLastError(comm_) : nullptr;
    const std::string message = fmt::format("{} failed on rank {} (device cuda:{}): {}{}{} (NCCL_DEBUG=WARN shows "
                                            "NCCL's own log)", what, rank(), o_.device, n.GetErrorString(r),
                                            last && *last ? ": " : "", last ? last : "");
    // ncclSystemError (2) and ncclRemoteError (6) come from the machine or the other ranks (sockets, shared
    // memory, a peer that exited): not ampforge's bugs, unlike invalid arguments or usage.
    if (r == 2 || r == 6) AF_THROW(Io, "{}", message);
    AF_THROW(Internal, "{}", message);
  }
  // The NCCL stream waits for the compute stream's work so far (device-side). Throws the watchdog's failure
  // once there is one: the communicator is then aborted.
  cu_stream begin() {
    watchdog_->check();
    Nccl& n = nccl();
    AF_CU(n.CtxSetCurrent(ctx_));
    cu_event ready = nullptr;
    AF_CU(n.EventCreate(&ready, kCuEventDisableTiming));
    AF_CU(n.EventRecord(ready, compute_));
    AF_CU(n.StreamWaitEvent(stream_, ready, 0));
    AF_CU(n.EventDestroy(ready));
    return stream_;
  }
  WorkPtr end(std::vector<Tensor> keep, const char* what, int64_t bytes) {
    Nccl& n = nccl();
    cu_event done = nullptr;
    AF_CU(n.EventCreate(&done, kCuEventDisableTiming));
    AF_CU(n.EventRecord(done, stream_));
    WorkPtr work = std::make_shared<NcclWork>(done, compute_, std::move(keep));
    watch(what, static_cast<size_t>(bytes));
    return work;
  }
  // Hands the watchdog an event that completes with the collective just enqueued (its own: a Work's event
  // goes with the Work).
  void watch(const char* what, size_t bytes) {
    Nccl& n = nccl();
    cu_event marker = nullptr;
    AF_CU(n.EventCreate(&marker, kCuEventDisableTiming));
    if (const cu_result r = n.EventRecord(marker, stream_); r != 0) {
      n.EventDestroy(marker);
      AF_THROW(Internal, "cuEventRecord failed: {}", cu_text(r));
    }
    watchdog_->launched(marker, fmt::format("{} of {} bytes", what, bytes));
  }

  // WatchdogBackend, on the watchdog's thread. NCCL allows ncclCommGetAsyncError and ncclCommAbort from a
  // thread other than the one enqueuing (the way PyTorch's watchdog uses them).
  void attach_thread() override { nccl().CtxSetCurrent(ctx_); }
  bool query(void* marker, std::string* error) override {
    const cu_result r = nccl().EventQuery(static_cast<cu_event>(marker));
    if (r == kCuErrorNotReady) return false;
    if (r != 0) *error = cu_text(r);
    return r == 0;
  }
  void release(void* marker) override { nccl().EventDestroy(static_cast<cu_event>(marker)); }
  std::string async_error() override {
    if (aborted_) return {};
    Nccl& n = nccl();
    nccl_result e = 0;
    if (n.CommGetAsyncError(comm_, &e) != 0 || e == 0 || e == kNcclInProgress) return {};
    const char* last = n.GetLastError != nullptr ? n.GetLastError(comm_) : nullptr;
    return fmt::format("{}{}{}", n.GetErrorString(e), last && *last ? ": " : "", last ? last : "");
  }
  void abort() override {
    if (aborted_.exchange(true)) return;
    nccl().CommAbort(comm_);
  }

  NcclOptions o_;
  cu_device dev_ = 0;
  cu_context ctx_ = nullptr;
  cu_stream stream_ = nullptr, compute_ = nullptr;
  nccl_comm comm_ = nullptr;
  std::atomic<bool> aborted_{false};
  cu_ptr scratch_ = 0;
  size_t scratch_bytes_ = 0;
  std::unique_ptr<CollectiveWatchdog> watchdog_;  // last: destroyed first (the destructor resets it anyway)
};

}  // namespace

const NcclStatus& nccl_status() { return nccl().status; }

CommunicatorPtr make_nccl_communicator(const NcclOptions& o) {
  const NcclStatus& st = nccl_status();
  AF_CHECK(st.available, "NCCL is not available: {}", st.reason);
  AF_CHECK(o.share_id != nullptr, "make_nccl_communicator: no way to share the unique id (share_id is empty)");
  AF_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size, "NCCL: rank {} is not in a world of {}", o.rank, o.size);
  check_collective_timeout(o.collective_timeout_s, "NCCL");
  return std::make_shared<NcclCommunicator>(o);
}

}  // namespace ampforge::dist
