#include "ampforge/train/data_parallel.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/error.h"

namespace ampforge::train {

std::vector<GradBucket> assign_buckets(const std::vector<std::vector<int64_t>>& offsets,
                                       const std::vector<std::vector<int64_t>>& ends,
                                       const std::vector<int64_t>& element_bytes, int64_t first_cap_bytes,
                                       int64_t cap_bytes) {
  AF_CHECK(first_cap_bytes > 0 && cap_bytes > 0, "data parallel: bucket sizes must be positive, got first {} and {} "
           "bytes", first_cap_bytes, cap_bytes);
  AF_ASSERT(offsets.size() == ends.size() && offsets.size() == element_bytes.size(), "assign_buckets: layout sizes");
  std::vector<GradBucket> out;
  // Groups last to first, parameters last to first: the order backward tends to finish them in.
  for (size_t gi = offsets.size(); gi-- > 0;) {
    const auto& off = offsets[gi];
    const auto& end = ends[gi];
    bool open = false;
    GradBucket b;
    for (size_t i = off.size(); i-- > 0;) {
      const int64_t cap = out.empty() ? first_cap_bytes : cap_bytes;
      if (open && (b.end - off[i]) * element_bytes[gi] > cap) {  // would overflow: close the bucket first
        out.push_back(b);
        open = false;
      }
      if (!open) {
        b = GradBucket{gi, i, i, off[i], end[i], Tensor()};
        open = true;
      } else {
        b.first_param = i;
        b.begin = off[i];
      }
    }
    if (open) out.push_back(b);
  }
  return out;
}

namespace {

// FNV-1a over the structure of the model: names, dtypes and shapes of parameters and buffers, in order.
uint64_t structure_hash(const nn::Module& model) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  };
  auto add = [&](const nn::NamedTensors& ts, char kind) {
    for (const auto& [name, t] : ts) {
      mix(&kind, 1);
      mix(name.data(), name.size());
      const auto d = static_cast<uint8_t>(t.dtype());
      mix(&d, 1);
      for (int64_t s : t.shape()) mix(&s, sizeof s);
    }
  };
  add(model.named_parameters(), 'p');
  add(model.named_buffers(), 'b');
  return h;
}

}  // namespace

void sync_model_from_rank0(dist::Communicator& comm, nn::Module& model) {
  const nn::NamedTensors params = model.named_parameters(), buffers = model.named_buffers();
  const uint64_t mine = structure_hash(model);
  const std::vector<uint64_t> hashes = comm.all_gather_u64(mine);
  const std::vector<uint64_t> counts = comm.all_gather_u64(static_cast<uint64_t>(model.num_parameters()));
  const std::vector<uint64_t> tensors = comm.all_gather_u64(params.size() + buffers.size() * (uint64_t{1} << 32));
  for (int r = 1; r < comm.size(); ++r) {
    const auto i = static_cast<size_t>(r);
    AF_CHECK(hashes[i] == hashes[0], "data parallel: rank {}'s model differs from rank 0's ({} parameters in {} "
             "tensors and {} buffers on rank {}, {} parameters in {} tensors and {} buffers on rank 0, or the same "
             "counts with other names, shapes or dtypes): every rank must build the same model (same --model, "
             "--image-size, data set and number of classes)", r, counts[i], tensors[i] & 0xffffffffu,
             tensors[i] >> 32, r, counts[0], tensors[0] & 0xffffffffu, tensors[0] >> 32);
  }
  autograd::NoGradGuard ng;
  std::vector<dist::WorkPtr> works;
  for (const auto& [name, t] : params) works.push_back(comm.broadcast(t, 0));
  for (const auto& [name, t] : buffers) works.push_back(comm.broadcast(t, 0));
  dist::wait_all(works);
}

void broadcast_buffers(dist::Communicator& comm, nn::Module& model) {
  std::vector<dist::WorkPtr> works;
  for (const auto& [name, t] : model.named_buffers()) works.push_back(comm.broadcast(t, 0));
  dist::wait_all(works);
}

DataParallel::DataParallel(dist::CommunicatorPtr comm, optim::Optimizer& opt, const DataParallelOptions& o)
    : comm_(std::move(comm)) {
  AF_CHECK(comm_ != nullptr, "DataParallel: no communicator");
  AF_CHECK(o.bucket_cap_mb > 0 && std::isfinite(o.bucket_cap_mb), "--bucket-mb must be positive, got {}",
           o.bucket_cap_mb);
  AF_CHECK(o.first_bucket_mb > 0 && std::isfinite(o.first_bucket_mb), "--first-bucket-mb must be positive, got {}",
           o.first_bucket_mb);
  const auto& groups = opt.param_groups();
  std::vector<std::vector<int64_t>> offsets(groups.size()), ends(groups.size());
  std::vector<int64_t> elem(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const Tensor& flat = groups[g].flat_grads;
    elem[g] = flat.element_size();
    for (const Tensor& p : groups[g].params) {
      const Tensor grad = p.grad();
      AF_ASSERT(grad.defined() && grad.storage() == flat.storage(), "DataParallel: a gradient is not a view of its "
                "group's flat buffer");
      offsets[g].push_back(grad.offset() - flat.offset());
    }
    for (size_t i = 0; i < offsets[g].size(); ++i)
      ends[g].push_back(i + 1 < offsets[g].size() ? offsets[g][i + 1] : flat.numel());
  }
  buckets_ = assign_buckets(offsets, ends, elem, static_cast<int64_t>(o.first_bucket_mb * (1 << 20)),
                            static_cast<int64_t>(o.bucket_cap_mb * (1 << 20)));
  for (GradBucket& b : buckets_) b.view = ops::narrow(groups[b.group].flat_grads, 0, b.begin, b.end - b.begin);
}

void DataParallel::reduce_gradients() {
  std::vector<dist::WorkPtr> works;
  works.reserve(buckets_.size());
  for (const GradBucket& b : buckets_) works.push_back(comm_->all_reduce(b.view, dist::ReduceOp::Avg));
  dist::wait_all(works);
}

Tensor DataParallel::average(const Tensor& scalar) {
  autograd::NoGradGuard ng;
  Tensor t = ops::clone(scalar);
  comm_->all_reduce(t, dist::ReduceOp::Avg)->wait();
  return t;
}

void DataParallel::combine_found_inf(const Tensor& found_inf) {
  comm_->all_reduce(found_inf, dist::ReduceOp::Max)->wait();
}

bool DataParallel::any(bool flag) {
  double v = flag ? 1.0 : 0.0;
  comm_->all_reduce_host(std::span<double>(&v, 1), dist::ReduceOp::Max);
  return v != 0.0;
}

}  // namespace ampforge::train
