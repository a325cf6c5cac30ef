// DataLoader: seeded shuffling, batching, per-channel normalisation, augmentation (random crop with zero
// padding, horizontal flip) and background worker threads that prefetch batches in order. Examples are read
// with Dataset::get(i, dst, ExampleContext) on the worker threads, so a dataset's own decoding and
// transforms (data/image_folder.h) run there too.
//
// Determinism: the order of an epoch depends only on (seed, epoch); the augmentation of an example only
// on (seed, epoch, example index): the loader's crop/flip and the key it hands the dataset
// (example_key). The number of workers changes speed, never the data.
//
// Device batches (LoaderOptions::device on CUDA): each worker builds the batch on the CPU and queues its
// upload on the device's copy stream through page-locked staging buffers (core/runtime.h's Uploader), so the copy of
// the next batches overlaps the current step; next() makes the compute stream wait for the copy (on the
// device, not the host) before handing the batch out.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ampforge/core/tensor.h"
#include "ampforge/data/dataset.h"

namespace ampforge::runtime {
class Uploader;
}

namespace ampforge::data {

struct Batch {
  Tensor x;  // (B, C, H, W) F32, normalised
  Tensor y;  // (B) I64 labels
  Tensor targets;  // detection data only (Dataset::max_targets() > 0): (B, T, 5) F32 rows (class, cx, cy, w, h)
  int64_t index = 0;  // batch number within the epoch
  uint64_t upload = 0;  // device batches: the pending upload's ticket until next() hands the batch out
};

struct LoaderOptions {
  int64_t batch_size = 128;
  bool shuffle = true;
  bool drop_last = false;
  uint64_t seed = 0;
  int workers = 1;   // background threads; 0 builds batches on the calling thread
  int prefetch = 2;  // batches ready ahead of the consumer
  bool normalize = true;
  // Normalisation constants, one per channel or one for every channel (use the training split's, e.g.
  // Dataset::normalization()): x = (x - mean[c]) * (1 / std[c]).
  std::vector<float> mean{0.0f}, std{1.0f};
  int64_t crop_padding = 0;       // > 0: random crop after zero padding by this many pixels
  bool hflip = false;
  MemoryFormat format = MemoryFormat::Contiguous;
  Device device = kCPU;  // where batches are delivered (CUDA: uploaded on the copy stream, see above)
  // Distributed sampler (data parallel): this loader delivers shard `shard_rank` of `shard_count`. The
  // epoch order is the same on every rank (it depends on (seed, epoch) only); global batch b is
  // positions [b G, (b + 1) G) of it, G = batch_size x shard_count, and rank r's batch b is the r-th
  // run of batch_size positions in it. So the ranks' batches b together are one batch of G, and rank r's
  // batch b is exactly batch (b x shard_count + r) of a single loader: N ranks see what one process with
  // `--accumulate N` sees in its micro-batches. The last, partial global batch is split evenly: padded by
  // repeating the epoch order from its start until its size divides by shard_count (every rank gets the
  // same number of examples), or, with drop_last, dropped. shard_count 1 is the plain loader.
  int shard_rank = 0, shard_count = 1;
};

// The key the loader passes to Dataset::get in ExampleContext::key for example `index` in `epoch`: a function
// of (seed, epoch, index) only, independent of the loader's own crop/flip stream.
uint64_t example_key(uint64_t seed, int64_t epoch, int64_t index);

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions opt);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t num_batches() const;
  int64_t batch_size() const { return opt_.batch_size; }
  const Dataset& dataset() const { return *ds_; }
  // Starts an epoch (stopping the previous one), skipping its first `skip_batches` batches (resume).
  void start_epoch(int64_t epoch, int64_t skip_batches = 0);
  // The next batch in order; nullopt at the end of the epoch. Blocks while the batch is being built.
  std::optional<Batch> next();
  // Seconds the consumer has spent blocked in next() since construction (data-loading stalls).
  double wait_seconds() const { return wait_ns_.load() * 1e-9; }

 private:
  Batch build(int64_t b) const;
  // Batch b of this shard: its first position in the epoch order and its size.
  std::pair<int64_t, int64_t> batch_span(int64_t b) const;
  void worker_loop();
  void stop_workers();
  Batch deliver(Batch b);  // device batches: the compute stream waits for the upload

  std::shared_ptr<const Dataset> ds_;
  LoaderOptions opt_;
  std::vector<int64_t> order_;
  int64_t epoch_ = 0, next_consume_ = 0, next_produce_ = 0, end_ = 0;
  std::mutex m_;
  std::condition_variable cv_produce_, cv_consume_;
  std::map<int64_t, Batch> ready_;
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> workers_;
  std::atomic<int64_t> wait_ns_{0};
  std::unique_ptr<runtime::Uploader> uploader_;  // device batches only
};

}  // namespace ampforge::data
