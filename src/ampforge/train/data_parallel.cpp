#include "ampforge/train/data_parallel.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "ampforge/autograd/node.h"
#include "ampforge/nn/layers.h"
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

// nn::ReplicaSum over a communicator: a blocking all-reduce (the statistics are needed right away).
class CommReplicaSum final : public nn::ReplicaSum {
 public:
  explicit CommReplicaSum(dist::CommunicatorPtr comm) : comm_(std::move(comm)) {}
  void all_reduce_sum(const Tensor& t) override { comm_->all_reduce(t, dist::ReduceOp::Sum)->wait(); }

 private:
  dist::CommunicatorPtr comm_;
};

int convert_children(nn::Module& m, const std::shared_ptr<nn::ReplicaSum>& sum) {
  int n = 0;
  if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(&m)) {
    bn->sync = sum;
    ++n;
  }
  for (auto& [name, child] : m.children()) n += convert_children(*child, sum);
  return n;
}

}  // namespace

int convert_sync_batchnorm(nn::Module& model, const dist::CommunicatorPtr& comm) {
  AF_CHECK(comm != nullptr, "convert_sync_batchnorm: no communicator");
  return convert_children(model, std::make_shared<CommReplicaSum>(comm));
}

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
    : comm_(std::move(comm)), opt_(opt), zero_(o.zero) {
  AF_CHECK(comm_ != nullptr, "DataParallel: no communicator");
  AF_CHECK(o.zero == 0 || o.zero == 1, "--zero must be 0 or 1 (ZeRO stages 2 and 3 are not implemented), got {}",
           o.zero);
  if (zero_ == 1) {
    // Reduce-scatter and all-gather whole flat buffers; no buckets, no overlap.
    opt.shard(comm_->rank(), comm_->size());
    return;
  }
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
  params_in_bucket_.assign(buckets_.size(), 0);
  ready_.assign(buckets_.size(), 0);
  if (!o.overlap) return;
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    const GradBucket& b = buckets_[bi];
    for (size_t i = b.first_param; i <= b.last_param; ++i) {
      ++params_in_bucket_[bi];
      hooks_.push_back(autograd::register_post_accumulate_grad_hook(groups[b.group].params[i],
                                                                    [this, bi](const Tensor&) { on_gradient_ready(bi); }));
    }
  }
}

void DataParallel::arm() {
  armed_ = !hooks_.empty();
  std::fill(ready_.begin(), ready_.end(), 0);
  next_ = 0;
  works_.clear();
}

void DataParallel::launch(size_t bucket) {
  AF_ASSERT(bucket == next_, "DataParallel: buckets must be launched in order");
  // A parameter backward did not reach still has its zeros to write (Optimizer::zero_grad marks, not fills).
  const GradBucket& b = buckets_[bucket];
  const std::vector<Tensor>& params = opt_.param_groups()[b.group].params;
  for (size_t i = b.first_param; i <= b.last_param; ++i) params[i].grad();
  works_.push_back(comm_->all_reduce(buckets_[bucket].view, dist::ReduceOp::Avg));
  ++next_;
}

void DataParallel::on_gradient_ready(size_t bucket) {
  if (!armed_) return;  // not the step's last backward: gradients are still accumulating
  ++ready_[bucket];
  // Every rank launches in bucket order, whatever order the buckets complete in.
  while (next_ < buckets_.size() && ready_[next_] == params_in_bucket_[next_]) {
    launch(next_);
    ++in_backward_;
  }
  // MPI progresses nonblocking collectives only inside MPI calls: give the launched ones a turn.
  for (const dist::WorkPtr& w : works_) w->is_completed();
}

void DataParallel::reduce_gradients() {
  if (zero_ == 1) {
    opt_.write_zero_grads();
    std::vector<dist::WorkPtr> works;
    for (const optim::ParamGroup& g : opt_.param_groups())
      works.push_back(comm_->reduce_scatter(g.flat_grads, g.shard_grads, dist::ReduceOp::Avg));
    dist::wait_all(works);
    return;
  }
  if (!armed_) arm();  // no backward pass launched anything
  while (next_ < buckets_.size()) launch(next_);
  dist::wait_all(works_);
  works_.clear();
  armed_ = false;
}

void DataParallel::gather_parameters() {
  if (zero_ != 1) return;
  autograd::NoGradGuard ng;
  std::vector<dist::WorkPtr> works;
  for (const optim::ParamGroup& g : opt_.param_groups())  // in place: this rank's shard is its own chunk
    works.push_back(comm_->all_gather(ops::narrow(g.flat_params, 0, g.shard_begin, g.shard_size), g.flat_params));
  dist::wait_all(works);
}

std::vector<std::pair<std::string, Tensor>> DataParallel::optimizer_state() {
  std::vector<std::pair<std::string, Tensor>> state = opt_.state_dict();
  if (zero_ != 1) return state;
  autograd::NoGradGuard ng;
  for (auto& [name, t] : state) {
    const size_t g = std::stoul(name.substr(5, name.find('.') - 5));  // "group<g>.<buffer>"
    const optim::ParamGroup& pg = opt_.param_groups()[g];
    if (t.numel() != pg.shard_size) continue;  // step, lr: the same on every rank
    Tensor full = ops::zeros({pg.shard_size * comm_->size()}, t.dtype(), t.device());
    comm_->all_gather(t.contiguous(), full)->wait();
    t = ops::narrow(full, 0, 0, opt_.unpadded_size(g));
  }
  return state;
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
