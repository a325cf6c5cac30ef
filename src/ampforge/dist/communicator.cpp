#include "ampforge/dist/communicator.h"

#include <algorithm>
#include <cstring>

#include "ampforge/util/error.h"

namespace ampforge::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

void wait_all(std::span<const WorkPtr> works) {
  for (const WorkPtr& w : works)
    if (w) w->wait();
}

Communicator::Communicator(int rank, int size) : rank_(rank), size_(size) {
  AF_CHECK(size >= 1 && rank >= 0 && rank < size, "communicator: rank {} is not in a world of {}", rank, size);
}

void Communicator::check_tensor(const Tensor& t, const char* what, bool chunked) const {
  AF_CHECK(t.defined(), "{} ({}): the tensor is undefined", what, backend());
  AF_CHECK(t.device() == device(), "{} ({}): the tensor is on {}, this communicator works on {}", what, backend(),
           t.device().str(), device().str());
  // Elementwise collectives only need the elements to fill one run of memory in the same order on every rank
  // (a channels-last weight is as good as a contiguous one); chunked ones (reduce_scatter, all_gather) cut the
  // tensor in row-major chunks.
  AF_CHECK(t.is_contiguous() || (!chunked && t.is_contiguous(MemoryFormat::ChannelsLast)),
           "{} ({}): the tensor must be dense{}; got shape {} with strides {}", what, backend(),
           chunked ? " and contiguous" : " (contiguous or channels-last)", t.shape().str(), t.strides().str());
}

void Communicator::check_reducible(const Tensor& t, const char* what) {
  const DType d = t.dtype();
  AF_CHECK(d == DType::F32 || d == DType::F16 || d == DType::BF16 || d == DType::F64,
           "{}: reductions take f32, f16, bf16 or f64 tensors, got {}", what, dtype_name(d));
}

std::vector<uint8_t> Communicator::all_gather_host(const void* data, size_t bytes) {
  std::vector<uint8_t> out(bytes * static_cast<size_t>(size_));
  if (bytes == 0) return out;
  host_all_gather(data, bytes, out.data());
  return out;
}

std::vector<uint64_t> Communicator::all_gather_u64(uint64_t value) {
  const std::vector<uint8_t> raw = all_gather_host(&value, sizeof value);
  std::vector<uint64_t> out(static_cast<size_t>(size_));
  std::memcpy(out.data(), raw.data(), raw.size());
  return out;
}

void Communicator::all_reduce_host(std::span<double> values, ReduceOp op) {
  if (values.empty()) return;
  const size_t n = values.size();
  const std::vector<uint8_t> raw = all_gather_host(values.data(), n * sizeof(double));
  std::vector<double> all(n * static_cast<size_t>(size_));
  std::memcpy(all.data(), raw.data(), raw.size());
  for (size_t i = 0; i < n; ++i) {
    double acc = all[i];
    for (int r = 1; r < size_; ++r) {
      const double v = all[static_cast<size_t>(r) * n + i];
      acc = op == ReduceOp::Max ? std::max(acc, v) : acc + v;
    }
    values[i] = op == ReduceOp::Avg ? acc / size_ : acc;
  }
}

std::string Communicator::broadcast_string(const std::string& text, int root) {
  AF_CHECK(root >= 0 && root < size_, "broadcast_string: root {} is not a rank of a world of {}", root, size_);
  const std::vector<uint64_t> lengths = all_gather_u64(rank_ == root ? text.size() : 0);
  const size_t len = lengths[static_cast<size_t>(root)];
  if (len == 0) return {};
  std::string mine = rank_ == root ? text : std::string(len, '\0');
  const std::vector<uint8_t> all = all_gather_host(mine.data(), len);
  return std::string(reinterpret_cast<const char*>(all.data()) + static_cast<size_t>(root) * len, len);
}

}  // namespace ampforge::dist
