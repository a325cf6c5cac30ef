/* A fake NCCL and CUDA driver in one library, for the NCCL communicator's tests on machines without a GPU
 * (src/ampforge/dist/nccl_communicator.cpp loads NCCL from AMPFORGE_NCCL_LIBRARY and the driver from
 * AMPFORGE_CUDA_DRIVER_LIBRARY; both point here). A world of one rank: "device memory" is host memory, streams
 * run every operation when it is enqueued, collectives copy their input (or leave it in place).
 *
 * What it can play, from the environment:
 *   FAKE_NCCL_HANG_AFTER=N     collectives after the N-th never complete (a rank that stopped taking part): their
 *                              stream stays busy, events recorded after them stay pending, cuStreamSynchronize
 *                              blocks, until ncclCommAbort.
 *   FAKE_NCCL_ASYNC_ERROR=1    ncclCommGetAsyncError reports ncclRemoteError once a collective has run (a peer's
 *                              connection broke).
 *   FAKE_NCCL_INIT_FAIL=1      ncclCommInitRank fails with ncclSystemError.
 * fake_nccl_live() counts the objects not yet released (streams, events, device memory, communicators, primary
 * context references): the tests check that the communicator gives everything back. Test-only code. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef int res_t;
typedef struct {
  int busy; /* a collective on it never completes (until the abort) */
} Stream;
typedef struct {
  Stream* stream; /* the stream it was recorded on while that was busy; NULL: complete */
} Event;
typedef struct {
  char internal[128];
} UniqueId;

enum { kNcclSuccess = 0, kNcclSystemError = 2, kNcclInvalidArgument = 4, kNcclRemoteError = 6 };
enum { kCudaSuccess = 0, kCudaInvalidValue = 1, kCudaInvalidDevice = 101, kCudaNotReady = 600 };

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_aborted, g_collectives;
static long g_live_streams, g_live_events, g_live_mem, g_live_comms, g_ctx_refs;
static int g_ctx_token; /* the address is the context handle */

static void bump(long* counter, long delta) {
  pthread_mutex_lock(&g_mu);
  *counter += delta;
  pthread_mutex_unlock(&g_mu);
}

static int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

/* ---- CUDA driver ---------------------------------------------------------------------------------------------- */
res_t cuInit(unsigned flags) { (void)flags; return kCudaSuccess; }
res_t cuDeviceGet(int* dev, int ordinal) {
  if (ordinal != 0) return kCudaInvalidDevice;
  *dev = 0;
  return kCudaSuccess;
}
res_t cuDevicePrimaryCtxRetain(void** ctx, int dev) {
  if (dev != 0) return kCudaInvalidDevice;
  bump(&g_ctx_refs, 1);
  *ctx = &g_ctx_token;
  return kCudaSuccess;
}
res_t cuDevicePrimaryCtxRelease_v2(int dev) {
  if (dev != 0) return kCudaInvalidDevice;
  bump(&g_ctx_refs, -1);
  return kCudaSuccess;
}
res_t cuCtxSetCurrent(void* ctx) { return ctx == NULL || ctx == &g_ctx_token ? kCudaSuccess : kCudaInvalidValue; }
res_t cuStreamCreate(void** s, unsigned flags) {
  (void)flags;
  *s = calloc(1, sizeof(Stream));
  bump(&g_live_streams, 1);
  return *s ? kCudaSuccess : kCudaInvalidValue;
}
res_t cuStreamDestroy_v2(void* s) {
  bump(&g_live_streams, -1);
  free(s);
  return kCudaSuccess;
}
res_t cuStreamSynchronize(void* s) {
  Stream* st = (Stream*)s;
  pthread_mutex_lock(&g_mu);
  while (st != NULL && st->busy && !g_aborted) pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
  return kCudaSuccess;
}
res_t cuStreamWaitEvent(void* s, void* e, unsigned flags) {
  (void)s, (void)e, (void)flags;
  return kCudaSuccess;
}
res_t cuEventCreate(void** e, unsigned flags) {
  (void)flags;
  *e = calloc(1, sizeof(Event));
  bump(&g_live_events, 1);
  return *e ? kCudaSuccess : kCudaInvalidValue;
}
res_t cuEventRecord(void* e, void* s) {
  Stream* st = (Stream*)s; /* NULL: the legacy default stream, never busy here */
  pthread_mutex_lock(&g_mu);
  ((Event*)e)->stream = st != NULL && st->busy ? st : NULL;
  pthread_mutex_unlock(&g_mu);
  return kCudaSuccess;
}
res_t cuEventQuery(void* e) {
  pthread_mutex_lock(&g_mu);
  const int pending = ((Event*)e)->stream != NULL && !g_aborted;
  pthread_mutex_unlock(&g_mu);
  return pending ? kCudaNotReady : kCudaSuccess;
}
res_t cuEventDestroy_v2(void* e) {
  bump(&g_live_events, -1);
  free(e);
  return kCudaSuccess;
}
res_t cuMemAlloc_v2(unsigned long long* p, size_t bytes) {
  void* m = malloc(bytes ? bytes : 1);
  if (!m) return kCudaInvalidValue;
  bump(&g_live_mem, 1);
  *p = (unsigned long long)(size_t)m;
  return kCudaSuccess;
}
res_t cuMemFree_v2(unsigned long long p) {
  bump(&g_live_mem, -1);
  free((void*)(size_t)p);
  return kCudaSuccess;
}
res_t cuMemcpyHtoDAsync_v2(unsigned long long dst, const void* src, size_t n, void* s) {
  (void)s;
  memcpy((void*)(size_t)dst, src, n);
  return kCudaSuccess;
}
res_t cuMemcpyDtoHAsync_v2(void* dst, unsigned long long src, size_t n, void* s) {
  (void)s;
  memcpy(dst, (const void*)(size_t)src, n);
  return kCudaSuccess;
}
res_t cuGetErrorName(res_t r, const char** s) {
  *s = r == kCudaNotReady ? "CUDA_ERROR_NOT_READY" : "CUDA_ERROR_FAKE";
  return kCudaSuccess;
}

/* ---- NCCL -------------------------------------------------------------------------------------------------------- */
res_t ncclGetVersion(int* v) {
  *v = 22105; /* 2.21.5 */
  return kNcclSuccess;
}
res_t ncclGetUniqueId(UniqueId* id) {
  memset(id->internal, 7, sizeof id->internal);
  return kNcclSuccess;
}
res_t ncclCommInitRank(void** comm, int n, UniqueId id, int rank) {
  (void)id;
  if (n != 1 || rank != 0) return kNcclInvalidArgument;
  if (env_int("FAKE_NCCL_INIT_FAIL", 0)) return kNcclSystemError;
  *comm = malloc(16);
  pthread_mutex_lock(&g_mu);
  ++g_live_comms;
  g_aborted = 0;
  pthread_mutex_unlock(&g_mu);
  return kNcclSuccess;
}
res_t ncclCommDestroy(void* comm) {
  bump(&g_live_comms, -1);
  free(comm);
  return kNcclSuccess;
}
res_t ncclCommAbort(void* comm) {
  pthread_mutex_lock(&g_mu);
  g_aborted = 1;
  --g_live_comms;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  free(comm);
  return kNcclSuccess;
}
res_t ncclCommGetAsyncError(void* comm, res_t* e) {
  (void)comm;
  pthread_mutex_lock(&g_mu);
  *e = env_int("FAKE_NCCL_ASYNC_ERROR", 0) && g_collectives > 0 ? kNcclRemoteError : kNcclSuccess;
  pthread_mutex_unlock(&g_mu);
  return kNcclSuccess;
}
const char* ncclGetErrorString(res_t r) {
  switch (r) {
    case kNcclSuccess: return "no error";
    case kNcclSystemError: return "unhandled system error";
    case kNcclInvalidArgument: return "invalid argument";
    case kNcclRemoteError: return "remote process exited or there was a network error";
    default: return "unknown result code";
  }
}
const char* ncclGetLastError(void* comm) {
  (void)comm;
  return "fake NCCL";
}

/* One collective on `stream`: runs `copy` unless it is one of the collectives that never complete. */
static res_t collective(void* stream, void* dst, const void* src, size_t bytes) {
  const int hang_after = env_int("FAKE_NCCL_HANG_AFTER", -1);
  pthread_mutex_lock(&g_mu);
  const int n = ++g_collectives;
  if (hang_after >= 0 && n > hang_after && stream != NULL) ((Stream*)stream)->busy = 1;
  pthread_mutex_unlock(&g_mu);
  if (dst != src && bytes > 0) memmove(dst, src, bytes);
  return kNcclSuccess;
}
static size_t type_size(int t) { return t == 0 || t == 1 ? 1 : t == 6 || t == 9 ? 2 : t == 4 || t == 5 || t == 8 ? 8 : 4; }

res_t ncclAllReduce(const void* s, void* r, size_t n, int t, int op, void* comm, void* st) {
  (void)op, (void)comm;
  return collective(st, r, s, n * type_size(t));
}
res_t ncclBroadcast(const void* s, void* r, size_t n, int t, int root, void* comm, void* st) {
  (void)root, (void)comm;
  return collective(st, r, s, n * type_size(t));
}
res_t ncclReduceScatter(const void* s, void* r, size_t n, int t, int op, void* comm, void* st) {
  (void)op, (void)comm;
  return collective(st, r, s, n * type_size(t));
}
res_t ncclAllGather(const void* s, void* r, size_t n, int t, void* comm, void* st) {
  (void)comm;
  return collective(st, r, s, n * type_size(t));
}

long fake_nccl_live(void) {
  pthread_mutex_lock(&g_mu);
  const long n = g_live_streams + g_live_events + g_live_mem + g_live_comms + g_ctx_refs;
  pthread_mutex_unlock(&g_mu);
  return n;
}
