/* libampforge_torch_alloc.so: ampforge's caching allocator inside PyTorch, through
 * torch.cuda.memory.CUDAPluggableAllocator (pytorch/pytorch torch/csrc/cuda/CUDAPluggableAllocator.cpp calls
 * `void* alloc(size_t size, int device, cudaStream_t stream)` and `void free(void* ptr, size_t size, int device,
 * cudaStream_t stream)`):
 *
 *   import torch
 *   a = torch.cuda.memory.CUDAPluggableAllocator("libampforge_torch_alloc.so", "af_torch_malloc", "af_torch_free")
 *   torch.cuda.memory.change_current_allocator(a)   # before PyTorch's first CUDA allocation
 *
 * One ampforge CachingAllocator per device (the ampforge policy): over CUDA's virtual-memory API (expandable
 * segments with granule reuse, memory/cuda_provider.h, libcuda loaded with dlopen) when the device supports it,
 * else over cudaMalloc/cudaFree of the CUDA runtime (dlopen: AMPFORGE_CUDART_LIBRARY when set, else the copy PyTorch
 * loaded, else libcudart.so.13/.12). AMPFORGE_TORCH_ALLOC_PROVIDER=cudart forces the latter.
 * Streams are pools, as in PyTorch: a freed block is reused on the stream that allocated it. The allocator never
 * sees record_stream (PyTorch calls no such hook of a pluggable allocator unless it is set), so memory used on
 * another stream must be synchronised by the caller, as with any pluggable allocator.
 *
 * Limits under a pluggable allocator (PyTorch's, not ours): torch.cuda.memory_stats(), max_memory_allocated(),
 * memory snapshots and _record_memory_history are unavailable ("does not yet support"): af_torch_stats() gives the
 * figures instead; the allocator must be installed before PyTorch's first CUDA allocation; CUDA IPC does not work.
 * Nothing here throws across the C ABI: a failed allocation returns NULL (PyTorch then raises its out-of-memory
 * error) and af_torch_last_error() says why.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The figures of one device's allocator (docs/MEMORY.md defines each). */
typedef struct af_torch_stats {
  int64_t requested, requested_peak;  /* bytes callers asked for, live now / at most */
  int64_t allocated, allocated_peak;  /* their rounded sizes */
  int64_t reserved, reserved_peak;    /* memory held from CUDA */
  int64_t largest_free_block;
  double fragmentation;               /* 1 - largest free block / reserved-but-free */
  int64_t num_allocs, num_frees, num_ooms, provider_calls, cache_hits;
} af_torch_stats;

void* af_torch_malloc(size_t size, int device, void* stream);
void af_torch_free(void* ptr, size_t size, int device, void* stream);
/* 0 and *out filled; -1 when nothing was allocated on `device` yet. */
int af_torch_stats_get(int device, af_torch_stats* out);
/* The same and more as one JSON object ("{}" before the first allocation); valid until the next call on this thread. */
const char* af_torch_stats_json(int device);
/* Gives cached memory back to CUDA on every device (what torch.cuda.empty_cache() would do; set it as the reset hook). */
void af_torch_empty_cache(void);
/* Why the last af_torch_malloc on this thread returned NULL ("" when none did). */
const char* af_torch_last_error(void);
/* "vmm" or "cudart": what backs `device` ("" before its first allocation). */
const char* af_torch_provider(int device);

#ifdef __cplusplus
}
#endif
