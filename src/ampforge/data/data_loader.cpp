#include "ampforge/data/data_loader.h"

#include <algorithm>
#include <cstring>

#include "ampforge/core/runtime.h"
#include "ampforge/core/generator.h"
#include "ampforge/data/transforms.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/timer.h"

namespace ampforge::data {

namespace {
// Stream keys: distinct constants keep the shuffle and augmentation streams independent.
uint64_t epoch_key(uint64_t seed, int64_t epoch, uint64_t salt) {
  auto w = philox4x32(seed ^ salt, static_cast<uint64_t>(epoch));
  return (static_cast<uint64_t>(w[0]) << 32) | w[1];
}
constexpr uint64_t kExampleSalt = 0xe7a3b1eULL;  // the datasets' per-example keys
uint64_t example_key_in(uint64_t epoch_example_key, int64_t index) {
  auto w = philox4x32(epoch_example_key, static_cast<uint64_t>(index));
  return (static_cast<uint64_t>(w[0]) << 32) | w[1];
}
}  // namespace

uint64_t example_key(uint64_t seed, int64_t epoch, int64_t index) {
  return example_key_in(epoch_key(seed, epoch, kExampleSalt), index);
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions opt) : ds_(std::move(dataset)), opt_(opt) {
  AF_CHECK(ds_ != nullptr, "DataLoader: no dataset");
  AF_CHECK(opt_.batch_size > 0, "DataLoader: batch size must be positive, got {}", opt_.batch_size);
  AF_CHECK(opt_.workers >= 0 && opt_.workers <= 64, "DataLoader: workers must be in [0, 64], got {}", opt_.workers);
  AF_CHECK(opt_.prefetch >= 1, "DataLoader: prefetch must be >= 1");
  Normalize(opt_.mean, opt_.std).check_channels(ds_->example_shape().empty() ? 1 : ds_->example_shape()[0], "DataLoader");
  AF_CHECK(opt_.crop_padding >= 0, "DataLoader: crop padding must be >= 0");
  AF_CHECK(ds_->max_targets() == 0 || (opt_.crop_padding == 0 && !opt_.hflip),
           "DataLoader: detection data ({}) augments itself (its boxes must follow); turn off the loader's crop and flip",
           ds_->name());
  if (opt_.format == MemoryFormat::ChannelsLast)
    AF_CHECK(ds_->example_shape().size() == 3, "DataLoader: channels-last needs (C, H, W) examples");
  AF_CHECK(opt_.device.is_cpu() || opt_.device.is_cuda(), "DataLoader: cannot deliver batches to {}",
           opt_.device.str());
  AF_CHECK(opt_.shard_count >= 1 && opt_.shard_rank >= 0 && opt_.shard_rank < opt_.shard_count,
           "DataLoader: shard {} of {} does not exist", opt_.shard_rank, opt_.shard_count);
  AF_CHECK(ds_->size() >= opt_.shard_count, "DataLoader: {} examples cannot be shared by {} ranks", ds_->size(),
           opt_.shard_count);
  // Staging buffers: one per batch that can be in flight (prefetched, being built, being consumed), so
  // that a worker rarely waits for a buffer.
  if (opt_.device.is_cuda())
    uploader_ = runtime::device_runtime(opt_.device)
                    .uploader(opt_.device.index, opt_.prefetch + std::max(opt_.workers, 1) + 1);
}

DataLoader::~DataLoader() { stop_workers(); }

Batch DataLoader::deliver(Batch b) {
  if (b.upload != 0) {
    std::vector<Tensor> dev{b.x, b.y};
    if (b.targets.defined()) dev.push_back(b.targets);
    uploader_->ready(dev, b.upload);
    b.upload = 0;
  }
  return b;
}

int64_t DataLoader::num_batches() const {
  const int64_t n = ds_->size(), global = opt_.batch_size * opt_.shard_count;
  return n / global + (!opt_.drop_last && n % global != 0 ? 1 : 0);
}

std::pair<int64_t, int64_t> DataLoader::batch_span(int64_t b) const {
  const int64_t n = ds_->size(), B = opt_.batch_size, N = opt_.shard_count, global = B * N;
  if (b < n / global) return {b * global + opt_.shard_rank * B, B};
  // The partial last global batch, padded to a multiple of N: T positions per rank.
  const int64_t rem = n - (n / global) * global, per_rank = (rem + N - 1) / N;
  return {(n / global) * global + opt_.shard_rank * per_rank, per_rank};
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lk(m_);
    stop_ = true;
  }
  cv_produce_.notify_all();
  cv_consume_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
  // Prefetched device batches nobody will consume: release their upload tickets.
  for (auto& [i, b] : ready_)
    if (b.upload != 0 && uploader_) uploader_->discard(b.upload);
  ready_.clear();
}

void DataLoader::start_epoch(int64_t epoch, int64_t skip_batches) {
  stop_workers();
  const int64_t n = ds_->size();
  order_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order_[i] = i;
  if (opt_.shuffle) {
    // Fisher-Yates with a Philox stream keyed by (seed, epoch).
    const uint64_t key = epoch_key(opt_.seed, epoch, 0x5f0ff1eULL);
    for (int64_t i = n - 1; i > 0; --i) {
      auto w = philox4x32(key, static_cast<uint64_t>(i));
      const uint64_t r = (static_cast<uint64_t>(w[0]) << 32) | w[1];
      std::swap(order_[i], order_[static_cast<int64_t>(r % static_cast<uint64_t>(i + 1))]);
    }
  }
  epoch_ = epoch;
  AF_CHECK(skip_batches >= 0 && skip_batches <= num_batches(), "DataLoader: cannot skip {} of {} batches", skip_batches,
           num_batches());
  next_consume_ = next_produce_ = skip_batches;
  end_ = num_batches();
  ready_.clear();
  error_ = nullptr;
  stop_ = false;
  for (int i = 0; i < opt_.workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

void DataLoader::worker_loop() {
  for (;;) {
    int64_t b;
    {
      std::unique_lock<std::mutex> lk(m_);
      cv_produce_.wait(lk, [&] { return stop_ || (next_produce_ < end_ && next_produce_ < next_consume_ + opt_.prefetch); });
      if (stop_) return;
      b = next_produce_++;
    }
    Batch batch;
    try {
      batch = build(b);
    } catch (...) {
      std::lock_guard<std::mutex> lk(m_);
      if (!error_) error_ = std::current_exception();
      cv_consume_.notify_all();
      return;
    }
    {
      std::lock_guard<std::mutex> lk(m_);
      ready_.emplace(b, std::move(batch));
    }
    cv_consume_.notify_all();
  }
}

std::optional<Batch> DataLoader::next() {
  if (next_consume_ >= end_) return std::nullopt;
  if (opt_.workers == 0) return deliver(build(next_consume_++));
  const int64_t t0 = now_ns();
  std::unique_lock<std::mutex> lk(m_);
  cv_consume_.wait(lk, [&] { return error_ || ready_.count(next_consume_) > 0; });
  wait_ns_.fetch_add(now_ns() - t0);
  if (error_) std::rethrow_exception(error_);
  auto it = ready_.find(next_consume_);
  Batch b = std::move(it->second);
  ready_.erase(it);
  ++next_consume_;
  lk.unlock();
  cv_produce_.notify_all();
  return deliver(std::move(b));
}

Batch DataLoader::build(int64_t b) const {
  const int64_t n = ds_->size();
  const auto [begin, bs] = batch_span(b);
  const Shape es = ds_->example_shape();
  const int64_t C = es[0], H = es.size() > 1 ? es[1] : 1, W = es.size() > 2 ? es[2] : 1;
  const int64_t plane = H * W, per = C * plane;
  Shape xs{bs};
  for (int64_t s : es) xs.push_back(s);
  Tensor x = Tensor::empty(xs, DType::F32, kCPU, opt_.format);
  Tensor y = Tensor::empty({bs}, DType::I64);
  float* xp = x.data<float>();
  int64_t* yp = y.data<int64_t>();
  const int64_t max_t = ds_->max_targets();  // detection data: (B, T, 5) rows, zero padded
  Tensor targets = max_t > 0 ? Tensor::empty({bs, max_t, 5}, DType::F32) : Tensor();
  float* tp = max_t > 0 ? targets.data<float>() : nullptr;
  if (tp) std::fill(tp, tp + bs * max_t * 5, 0.0f);
  const bool cl = opt_.format == MemoryFormat::ChannelsLast && C > 1;
  // Per channel: (x - mean) * (1 / std), the arithmetic of Normalize (transforms.h).
  std::vector<float> mean(static_cast<size_t>(C), 0.0f), inv_std(static_cast<size_t>(C), 1.0f);
  if (opt_.normalize) {
    const Normalize norm(opt_.mean, opt_.std);
    for (int64_t c = 0; c < C; ++c) {
      mean[static_cast<size_t>(c)] = norm.mean(c);
      inv_std[static_cast<size_t>(c)] = norm.inv_std(c);
    }
  }
  const uint64_t aug_key = epoch_key(opt_.seed, epoch_, 0xa06e47ULL);
  const uint64_t ex_key = epoch_key(opt_.seed, epoch_, kExampleSalt);
  std::vector<float> raw(static_cast<size_t>(per)), tmp(static_cast<size_t>(per));
  const bool augment = opt_.crop_padding > 0 || opt_.hflip;
  // Without the loader's crop/flip, a contiguous batch needs no staging: the dataset writes the example
  // in place and it is normalised there (the same arithmetic, one pass less over the batch).
  const bool in_place = !augment && !cl;
  for (int64_t k = 0; k < bs; ++k) {
    const int64_t idx = order_[(begin + k) % n];  // positions past the end: the padding of a sharded epoch
    float* dst = xp + k * per;
    const ExampleContext ctx{example_key_in(ex_key, idx), epoch_, idx};
    ds_->get(idx, in_place ? dst : raw.data(), ctx);
    yp[k] = ds_->label(idx);
    if (tp) ds_->targets(idx, ctx, tp + k * max_t * 5);
    const float* src = in_place ? dst : raw.data();
    if (augment) {
      auto w = philox4x32(aug_key, static_cast<uint64_t>(idx));
      const int64_t p = opt_.crop_padding;
      const int64_t dy = p > 0 ? static_cast<int64_t>(w[0] % static_cast<uint32_t>(2 * p + 1)) - p : 0;
      const int64_t dx = p > 0 ? static_cast<int64_t>(w[1] % static_cast<uint32_t>(2 * p + 1)) - p : 0;
      const bool flip = opt_.hflip && (w[2] & 1u);
      for (int64_t c = 0; c < C; ++c)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t ww = 0; ww < W; ++ww) {
            const int64_t sh = h + dy, sw0 = flip ? W - 1 - ww : ww, sw = sw0 + dx;
            tmp[c * plane + h * W + ww] = (sh >= 0 && sh < H && sw >= 0 && sw < W) ? raw[c * plane + sh * W + sw] : 0.0f;
          }
      src = tmp.data();
    }
    if (cl) {
      for (int64_t c = 0; c < C; ++c) {
        const float m = mean[static_cast<size_t>(c)], is = inv_std[static_cast<size_t>(c)];
        for (int64_t q = 0; q < plane; ++q) dst[q * C + c] = (src[c * plane + q] - m) * is;
      }
    } else {
      for (int64_t c = 0; c < C; ++c) {
        const float m = mean[static_cast<size_t>(c)], is = inv_std[static_cast<size_t>(c)];
        for (int64_t q = c * plane; q < (c + 1) * plane; ++q) dst[q] = (src[q] - m) * is;
      }
    }
  }
  Batch out;
  out.index = b;
  if (uploader_) {
    std::vector<Tensor> host{x, y};
    if (targets.defined()) host.push_back(targets);
    std::vector<Tensor> dev = uploader_->upload(host, &out.upload);
    out.x = dev[0], out.y = dev[1];
    if (targets.defined()) out.targets = dev[2];
    return out;
  }
  out.x = x, out.y = y, out.targets = targets;
  return out;
}

}  // namespace ampforge::data
