// Data parallel training: the pieces of a step that talk to the other ranks (PyTorch's
// DistributedDataParallel, for ampforge's flat buffers). The Trainer uses it when
// TrainerOptions::data_parallel has a communicator; train_step calls it through StepOptions.
//
//  - Start: every rank's model must be the same (names, shapes, dtypes of parameters and buffers: a hash
//    compared across ranks; the error names the first rank that differs and what differs), then rank 0's
//    parameters and buffers are broadcast, before the optimizer copies them into its flat buffers.
//  - Gradients: reduced (Avg) in buckets that are views of the optimizer's flat gradient buffers, so nothing
//    is copied: parameters in reverse order (about the order backward produces their gradients), a first
//    bucket of first_bucket_mb (the last layers' gradients, ready first, go out early) and then buckets of up
//    to bucket_cap_mb; a parameter larger than a bucket is a bucket of its own, and a bucket never spans two
//    parameter groups. Every rank derives the same buckets from the same model and launches them in bucket
//    order. Only the step's last micro-batch communicates (gradient accumulation): with `overlap`, a
//    post-accumulate-grad hook on every parameter counts the bucket's completed gradients during that
//    micro-batch's backward and launches the bucket as soon as it is complete and every bucket before it has
//    been launched; reduce_gradients() then launches what is left (parameters that got no gradient) and
//    waits for all.
//  - Losses are averaged over the ranks before the step looks at them, so every rank takes the same
//    non-finite-loss decision and reports the global batch's loss; GradScaler's found-inf is combined (Max)
//    so every rank skips the same steps.
//  - BatchNorm statistics stay local to each rank during training (DDP's default); buffers are broadcast from
//    rank 0 before evaluation and checkpoints, and at the end, so every rank ends with rank 0's.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ampforge/autograd/hooks.h"
#include "ampforge/core/tensor.h"
#include "ampforge/dist/communicator.h"
#include "ampforge/nn/module.h"
#include "ampforge/optim/optimizer.h"

namespace ampforge::train {

struct DataParallelOptions {
  dist::CommunicatorPtr communicator;  // null: one process (everything below is ignored)
  double bucket_cap_mb = 25;           // PyTorch DDP's bucket_cap_mb
  double first_bucket_mb = 1;          // DDP's first bucket (kDefaultFirstBucketBytes)
  // Start each bucket's all-reduce from the backward pass, as soon as its gradients are complete
  // (autograd/hooks.h), instead of after backward. Same results either way.
  bool overlap = true;
  // ZeRO stage: 0 plain data parallel; 1 optimizer state sharded over the ranks (optim::Optimizer::shard):
  // gradients are reduce-scattered (each rank receives the average of its shard), each rank steps its shard,
  // and the parameters are all-gathered after the step. Same results as stage 0.
  int zero = 0;
  // SyncBatchNorm (torch.nn.SyncBatchNorm.convert_sync_batchnorm): every BatchNorm2d of the model normalises
  // with the statistics of the global batch in training (convert_sync_batchnorm below). Off: local statistics,
  // as DDP's default.
  bool sync_batchnorm = false;
};

// Makes every BatchNorm2d in `model` a SyncBatchNorm over `comm`'s ranks (nn::BatchNorm2d::sync); returns how many.
int convert_sync_batchnorm(nn::Module& model, const dist::CommunicatorPtr& comm);

// One bucket: a contiguous run of one parameter group's flat gradient buffer covering parameters
// [first_param, last_param] of that group (its alignment padding included).
struct GradBucket {
  size_t group = 0;
  size_t first_param = 0, last_param = 0;
  int64_t begin = 0, end = 0;  // elements of the group's flat buffer
  Tensor view;                 // flat_grads[begin, end): a view, not a copy
};

// The bucket layout for groups of parameters with the given element counts and element size, in the
// order they are launched (reverse parameter order). `offsets[g][i]` is parameter i's first element in
// group g's flat buffer, `ends` one past its last (with padding: the next parameter's offset, or the
// buffer's size). Pure: the trainer passes the optimizer's layout; tests pass their own.
std::vector<GradBucket> assign_buckets(const std::vector<std::vector<int64_t>>& offsets,
                                       const std::vector<std::vector<int64_t>>& ends,
                                       const std::vector<int64_t>& element_bytes, int64_t first_cap_bytes,
                                       int64_t cap_bytes);

// Checks that every rank has the same model (throws InvalidArgument naming the first rank that differs),
// then copies rank 0's parameters and buffers to every rank. Call before building the optimizer.
void sync_model_from_rank0(dist::Communicator& comm, nn::Module& model);

// Rank 0's buffers (BatchNorm statistics) to every rank.
void broadcast_buffers(dist::Communicator& comm, nn::Module& model);

class DataParallel {
 public:
  DataParallel(dist::CommunicatorPtr comm, optim::Optimizer& opt, const DataParallelOptions& options);

  dist::Communicator& comm() { return *comm_; }
  const std::vector<GradBucket>& buckets() const { return buckets_; }

  // The next backward pass is the step's last: buckets may start from it (with options.overlap).
  void arm();
  // Averages the gradients over the ranks: launches, in bucket order, the buckets the backward pass did not
  // start, then waits for every bucket.
  void reduce_gradients();
  // ZeRO-1: every rank's updated parameter shards to every rank (after the optimizer step). No-op otherwise.
  void gather_parameters();
  // The optimizer's state as a checkpoint holds it: sharded state gathered from every rank (a collective:
  // every rank calls it), without the sharded layout's padding; the optimizer's own state_dict otherwise.
  std::vector<std::pair<std::string, Tensor>> optimizer_state();
  int zero_stage() const { return zero_; }
  // Buckets launched from inside backward passes so far (overlap at work).
  int64_t buckets_launched_in_backward() const { return in_backward_; }
  // The mean over the ranks of a one-element F32 tensor (a new tensor).
  Tensor average(const Tensor& scalar);
  // found_inf (one element) becomes the maximum over the ranks, in place.
  void combine_found_inf(const Tensor& found_inf);
  // True when any rank passes true (blocking, on the host): agreeing to stop at the same step.
  bool any(bool flag);

 private:
  void on_gradient_ready(size_t bucket);
  void launch(size_t bucket);

  dist::CommunicatorPtr comm_;
  optim::Optimizer& opt_;
  int zero_ = 0;
  std::vector<GradBucket> buckets_;
  std::vector<int> params_in_bucket_, ready_;
  std::vector<std::unique_ptr<autograd::HookHandle>> hooks_;
  std::vector<dist::WorkPtr> works_;
  size_t next_ = 0;  // the next bucket to launch
  bool armed_ = false;
  int64_t in_backward_ = 0;
};

}  // namespace ampforge::train
