#include "ampforge/dist/mpi_communicator.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ampforge/core/half.h"
#include "ampforge/dist/watchdog.h"
#include "ampforge/util/error.h"

#ifdef AMPFORGE_WITH_MPI
// The C API only: MPI's deprecated C++ bindings would need libmpi_cxx at link time.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace ampforge::dist {

#ifndef AMPFORGE_WITH_MPI

namespace {
[[noreturn]] void no_mpi() {
  AF_THROW(InvalidArgument, "this ampforge was built without MPI: install OpenMPI (scripts/setup installs "
                            "libopenmpi-dev openmpi-bin) and rebuild, or run on GPUs with NCCL");
}
}  // namespace

bool mpi_built() { return false; }
void mpi_init() { no_mpi(); }
bool mpi_initialized() { return false; }
std::pair<int, int> mpi_world() { no_mpi(); }
std::pair<int, int> mpi_local_rank() { no_mpi(); }
CommunicatorPtr make_mpi_communicator(double) { no_mpi(); }
void mpi_broadcast_bytes(void*, size_t, int) { no_mpi(); }
void mpi_abort(int) {}

#else

namespace {

constexpr int64_t kMaxCount = int64_t{1} << 30;  // elements per MPI call (MPI counts are int)

std::string mpi_error_text(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
  return std::string(buf, static_cast<size_t>(len));
}

#define AF_MPI(call)                                                                           \
  do {                                                                                         \
    const int af_mpi_rc_ = (call);                                                             \
    if (af_mpi_rc_ != MPI_SUCCESS) AF_THROW(Internal, "{} failed: {}", #call, mpi_error_text(af_mpi_rc_)); \
  } while (0)

void finalize_at_exit() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();
}

bool finalized() {
  int fin = 0;
  MPI_Finalized(&fin);
  return fin != 0;
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

// 16-bit floats <-> the F32 staging buffer.
void widen(const Tensor& t, float* dst) {
  const auto* src = static_cast<const uint16_t*>(t.data_ptr());
  const int64_t n = t.numel();
  if (t.dtype() == DType::F16)
    for (int64_t i = 0; i < n; ++i) dst[i] = half_bits_to_float(src[i]);
  else
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(src[i]);
}
void narrow_into(const float* src, const Tensor& t) {
  auto* dst = static_cast<uint16_t*>(t.data_ptr());
  const int64_t n = t.numel();
  if (t.dtype() == DType::F16)
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_half_bits(src[i]);
  else
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16_bits(src[i]);
}
bool is_16bit(DType d) { return d == DType::F16 || d == DType::BF16; }

template <class T>
void divide(T* p, int64_t n, int size) {
  const T d = static_cast<T>(size);
  for (int64_t i = 0; i < n; ++i) p[i] /= d;
}

// The collective limit of one communicator (--collective-timeout), shared with its Works.
struct MpiLimit {
  double timeout_s = 1800;  // 0: none
  std::string where;        // "rank 0"
  uint64_t launched = 0;    // collectives so far: their sequence numbers
  bool failed = false;      // one timed out: nothing waits on this communicator any more
};

// Buffers of collectives that never completed: MPI may still write into them until the job is aborted, so they
// are kept for the rest of the process.
void keep_forever(std::vector<Tensor> tensors, std::vector<float> a, std::vector<float> b) {
  struct Kept {
    std::vector<Tensor> tensors;
    std::vector<float> a, b;
  };
  static std::mutex mu;
  static auto* kept = new std::vector<Kept>;
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(Kept{std::move(tensors), std::move(a), std::move(b)});
}

// MPI_Testall until the requests complete, or false once `timeout_s` (> 0) has passed. Open MPI progresses
// collectives only inside MPI calls, so the loop polls without pause for the first millisecond (as MPI_Waitall
// spins), then yields the core between polls, and after 50 ms sleeps 100 us between them: a rank waiting for a
// slower one leaves the CPU to the ranks sharing the machine.
bool test_until_complete(std::vector<MPI_Request>& requests, double timeout_s, const char* what, double* waited) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    int flag = 0;
    const int rc = MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) AF_THROW(Internal, "{} (mpi): MPI_Testall failed: {}", what, mpi_error_text(rc));
    if (flag) return true;
    *waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout_s > 0 && *waited > timeout_s) return false;
    if (*waited > 0.05) std::this_thread::sleep_for(std::chrono::microseconds(100));
    else if (*waited > 0.001) sched_yield();
  }
}

class MpiWork final : public Work {
 public:
  std::vector<MPI_Request> requests;
  std::vector<Tensor> keep;            // the caller's tensors, alive until completion
  std::vector<float> staging_in, staging_out;
  std::function<void()> finish;        // after the requests complete: Avg division, 16-bit rounding
  const char* what = "";
  int64_t bytes = 0;                   // for messages
  uint64_t seq = 0;                    // this communicator's collective number
  double timeout_s = 0;                // the communicator's limit when it was launched
  std::shared_ptr<MpiLimit> limit;

  ~MpiWork() override {
    // An unfinished request must complete before its buffers go away; after a timeout nothing is waited for.
    if (done_ || finalized()) return;
    if (limit->failed) {
      abandon();
      return;
    }
    try {
      wait();
    } catch (...) {
    }
  }
  // Throws Error(Io) naming the collective when it is still pending after the communicator's limit. MPI
  // cannot cancel a collective: the caller ends the job (ampforge's main calls dist::abort_job, MPI_Abort).
  void wait() override {
    if (done_) return;
    if (limit->failed) {
      abandon();
      AF_THROW(Io, "{} (mpi) was not waited for: an earlier collective of this communicator timed out", what);
    }
    double waited = 0;
    if (!requests.empty() && !test_until_complete(requests, timeout_s, what, &waited)) {
      limit->failed = true;
      abandon();
      const std::string named = bytes > 0 ? fmt::format("{} of {} bytes (mpi)", what, bytes) : fmt::format("{} (mpi)", what);
      AF_THROW(Io, "{}", collective_timeout_message(named, seq, waited, limit->where));
    }
    complete();
  }
  bool is_completed() override {
    if (done_) return true;
    int flag = 1;
    if (!requests.empty()) {
      const int rc = MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) AF_THROW(Internal, "{} (mpi): MPI_Testall failed: {}", what, mpi_error_text(rc));
    }
    if (flag) complete();
    return done_;
  }

 private:
  void complete() {
    done_ = true;
    if (finish) finish();
    finish = nullptr;
    keep.clear();
  }
  void abandon() {
    done_ = true;
    finish = nullptr;
    keep_forever(std::move(keep), std::move(staging_in), std::move(staging_out));
  }
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size, double collective_timeout_s)
      : Communicator(rank, size), comm_(comm), limit_(std::make_shared<MpiLimit>()) {
    limit_->timeout_s = collective_timeout_s;
    limit_->where = fmt::format("rank {}", rank);
  }
  ~MpiCommunicator() override {
    if (!finalized()) MPI_Comm_free(&comm_);
  }
  const char* backend() const override { return "mpi"; }
  Device device() const override { return kCPU; }
  double collective_timeout() const override { return limit_->timeout_s; }
  void set_collective_timeout(double seconds) override {
    check_collective_timeout(seconds, "MPI");
    limit_->timeout_s = seconds;
  }

  WorkPtr all_reduce(const Tensor& t, ReduceOp op) override {
    check_tensor(t, "all_reduce");
    check_reducible(t, "all_reduce");
    auto w = make_work("all_reduce", t.nbytes());
    w->keep = {t};
    const int64_t n = t.numel();
    if (is_16bit(t.dtype())) {
      w->staging_in.resize(static_cast<size_t>(n));
      widen(t, w->staging_in.data());
      in_place_chunks(*w, w->staging_in.data(), n, MPI_FLOAT, sizeof(float), op);
      w->finish = [w = w.get(), t, op, size = size()] {
        if (op == ReduceOp::Avg) divide(w->staging_in.data(), t.numel(), size);
        narrow_into(w->staging_in.data(), t);
      };
    } else {
      const bool f64 = t.dtype() == DType::F64;
      in_place_chunks(*w, t.data_ptr(), n, f64 ? MPI_DOUBLE : MPI_FLOAT, f64 ? sizeof(double) : sizeof(float), op);
      if (op == ReduceOp::Avg)
        w->finish = [t, f64, size = size()] {
          if (f64) divide(static_cast<double*>(t.data_ptr()), t.numel(), size);
          else divide(static_cast<float*>(t.data_ptr()), t.numel(), size);
        };
    }
    return w;
  }

  WorkPtr broadcast(const Tensor& t, int root) override {
    check_tensor(t, "broadcast");
    AF_CHECK(root >= 0 && root < size(), "broadcast (mpi): root {} is not a rank of a world of {}", root, size());
    auto w = make_work("broadcast", t.nbytes());
    w->keep = {t};
    auto* p = static_cast<char*>(t.data_ptr());
    for (int64_t off = 0; off < t.nbytes(); off += kMaxCount) {
      const int count = static_cast<int>(std::min<int64_t>(kMaxCount, t.nbytes() - off));
      w->requests.emplace_back();
      AF_MPI(MPI_Ibcast(p + off, count, MPI_BYTE, root, comm_, &w->requests.back()));
    }
    return w;
  }

  WorkPtr reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    check_tensor(in, "reduce_scatter input", true);
    check_tensor(out, "reduce_scatter output", true);
    check_reducible(in, "reduce_scatter");
    AF_CHECK(in.dtype() == out.dtype(), "reduce_scatter (mpi): input is {}, output {}", dtype_name(in.dtype()),
             dtype_name(out.dtype()));
    const int64_t n = out.numel();
    AF_CHECK(in.numel() == n * size(), "reduce_scatter (mpi): input has {} elements, expected {} (world {} x output "
             "{})", in.numel(), n * size(), size(), n);
    AF_CHECK(n <= kMaxCount, "reduce_scatter (mpi): {} elements per rank is more than one MPI call carries ({})", n,
             kMaxCount);
    auto w = make_work("reduce_scatter", in.nbytes());
    w->keep = {in, out};
    w->requests.emplace_back();
    if (is_16bit(in.dtype())) {
      w->staging_in.resize(static_cast<size_t>(in.numel()));
      w->staging_out.resize(static_cast<size_t>(n));
      widen(in, w->staging_in.data());
      AF_MPI(MPI_Ireduce_scatter_block(w->staging_in.data(), w->staging_out.data(), static_cast<int>(n), MPI_FLOAT,
                                       mpi_op(op), comm_, &w->requests.back()));
      w->finish = [w = w.get(), out, op, size = size()] {
        if (op == ReduceOp::Avg) divide(w->staging_out.data(), out.numel(), size);
        narrow_into(w->staging_out.data(), out);
      };
    } else {
      const bool f64 = in.dtype() == DType::F64;
      AF_MPI(MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), static_cast<int>(n), f64 ? MPI_DOUBLE : MPI_FLOAT,
                                       mpi_op(op), comm_, &w->requests.back()));
      if (op == ReduceOp::Avg)
        w->finish = [out, f64, size = size()] {
          if (f64) divide(static_cast<double*>(out.data_ptr()), out.numel(), size);
          else divide(static_cast<float*>(out.data_ptr()), out.numel(), size);
        };
    }
    return w;
  }

  WorkPtr all_gather(const Tensor& in, const Tensor& out) override {
    check_tensor(in, "all_gather input", true);
    check_tensor(out, "all_gather output", true);
    AF_CHECK(in.dtype() == out.dtype(), "all_gather (mpi): input is {}, output {}", dtype_name(in.dtype()),
             dtype_name(out.dtype()));
    AF_CHECK(out.numel() == in.numel() * size(), "all_gather (mpi): output has {} elements, expected {} (world {} x "
             "input {})", out.numel(), in.numel() * size(), size(), in.numel());
    AF_CHECK(in.nbytes() <= kMaxCount, "all_gather (mpi): {} bytes per rank is more than one MPI call carries ({})",
             in.nbytes(), kMaxCount);
    auto w = make_work("all_gather", out.nbytes());
    w->keep = {in, out};
    w->requests.emplace_back();
    // In place (ZeRO-1 gathers the parameter shards into the buffer they are views of): MPI says so with
    // MPI_IN_PLACE; any other overlap of input and output is an error.
    const auto* ip = static_cast<const char*>(in.data_ptr());
    const auto* op = static_cast<const char*>(out.data_ptr());
    const bool in_place = ip == op + static_cast<size_t>(rank()) * static_cast<size_t>(in.nbytes());
    AF_CHECK(in_place || ip + in.nbytes() <= op || op + out.nbytes() <= ip, "all_gather (mpi): the input overlaps "
             "the output other than as this rank's chunk");
    AF_MPI(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data_ptr(), static_cast<int>(in.nbytes()), MPI_BYTE,
                          out.data_ptr(), static_cast<int>(in.nbytes()), MPI_BYTE, comm_, &w->requests.back()));
    return w;
  }

  void barrier() override {
    auto w = make_work("barrier", 0);
    w->requests.emplace_back();
    AF_MPI(MPI_Ibarrier(comm_, &w->requests.back()));
    w->wait();
  }

 protected:
  void host_all_gather(const void* in, size_t bytes, void* out) override {
    AF_CHECK(bytes <= static_cast<size_t>(kMaxCount), "all_gather_host (mpi): {} bytes is too many", bytes);
    // Host buffers owned by the caller: after a timeout the job ends (abort_job) before they go away.
    auto w = make_work("all_gather of host values", static_cast<int64_t>(bytes) * size());
    w->requests.emplace_back();
    AF_MPI(MPI_Iallgather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes), MPI_BYTE, comm_,
                          &w->requests.back()));
    w->wait();
  }

 private:
  std::shared_ptr<MpiWork> make_work(const char* what, int64_t bytes) {
    auto w = std::make_shared<MpiWork>();
    w->what = what;
    w->bytes = bytes;
    w->seq = ++limit_->launched;
    w->timeout_s = limit_->timeout_s;
    w->limit = limit_;
    return w;
  }

  void in_place_chunks(MpiWork& w, void* data, int64_t n, MPI_Datatype type, size_t elem, ReduceOp op) {
    auto* p = static_cast<char*>(data);
    for (int64_t off = 0; off < n; off += kMaxCount) {
      const int count = static_cast<int>(std::min<int64_t>(kMaxCount, n - off));
      w.requests.emplace_back();
      AF_MPI(MPI_Iallreduce(MPI_IN_PLACE, p + static_cast<size_t>(off) * elem, count, type, mpi_op(op), comm_,
                            &w.requests.back()));
    }
  }

  MPI_Comm comm_;
  std::shared_ptr<MpiLimit> limit_;
};

}  // namespace

bool mpi_built() { return true; }

void mpi_init() {
  int init = 0;
  MPI_Initialized(&init);
  if (init) return;
  AF_CHECK(!finalized(), "MPI was already finalised in this process; it cannot be initialised again");
  int provided = 0;
  AF_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
  // Errors come back as codes (turned into exceptions with MPI's text) instead of aborting the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::atexit(finalize_at_exit);
}

bool mpi_initialized() {
  int init = 0;
  MPI_Initialized(&init);
  return init != 0 && !finalized();
}

std::pair<int, int> mpi_world() {
  mpi_init();
  int rank = 0, size = 1;
  AF_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  AF_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
  return {rank, size};
}

std::pair<int, int> mpi_local_rank() {
  mpi_init();
  MPI_Comm local;
  AF_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
  int rank = 0, size = 1;
  MPI_Comm_rank(local, &rank);
  MPI_Comm_size(local, &size);
  MPI_Comm_free(&local);
  return {rank, size};
}

CommunicatorPtr make_mpi_communicator(double collective_timeout_s) {
  check_collective_timeout(collective_timeout_s, "MPI");
  const auto [rank, size] = mpi_world();
  MPI_Comm comm;
  AF_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::make_shared<MpiCommunicator>(comm, rank, size, collective_timeout_s);
}

void mpi_broadcast_bytes(void* data, size_t bytes, int root) {
  mpi_init();
  AF_CHECK(bytes <= static_cast<size_t>(kMaxCount), "mpi_broadcast_bytes: {} bytes is too many", bytes);
  AF_MPI(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD));
}

void mpi_abort(int code) {
  if (!mpi_initialized()) return;
  MPI_Abort(MPI_COMM_WORLD, code);
}

#endif  // AMPFORGE_WITH_MPI

}  // namespace ampforge::dist
