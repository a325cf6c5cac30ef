/* A fake NVML for the doctor and monitor tests: a shared library exporting the NVML functions ampforge
 * uses, answering from a scenario picked by the environment variable FAKE_NVML_SCENARIO:
 *   healthy_h200    one H200, Gen5 x16, cool, ECC clean, no fan (SXM boards have none)
 *   h200_vm         one H200 SXM alone in a virtual machine on driver 580 (CUDA 13.0), as a real one answers
 *                   there: idle at Gen1 x16 (power saving), Gen5 while host-to-device copies run (see below);
 *                   18 NVLinks, none up (no NVSwitch fabric in the VM); no fan; persistence mode off; clocks
 *                   held for being idle; PCIe throughput NOT_SUPPORTED (exercising that path)
 *   rtx4080_gen3x8  an RTX 4080 whose link trained at Gen3 x8 (GPU and slot support Gen4 x16)
 *   hot             an RTX 4090 at 87 C, slowdown at 90 C, thermal + power throttling, another process
 *   fanless         an L40S: fan speed answers NOT_SUPPORTED
 *   old_driver      an H100 PCIe on driver 470.57.02 (CUDA 11.4)
 *   lost            two H200s; GPU 1 answers GPU_IS_LOST after FAKE_NVML_LOSE_AFTER_CALLS (default 20)
 *                   device queries: in the middle of doctor's reads, at monitor's second sample
 *   no_gpu          the driver loads but reports no GPU
 *   nvlink_pair     two H200s joined by 4 NVLinks (all up), PCIe path between them SYS
 *   nvlink_down     the same with GPU 0's link 2 down
 *   pcie_sys        two RTX 4090s without NVLink on different CPU sockets (PCIe path SYS)
 * Built twice: complete, and with FAKE_NVML_PARTIAL defined, when it exports only about half of the
 * functions (19 of 43: no PCI info, maximum link, thresholds, fan, power limit, clock-event reasons, ECC,
 * persistence, MIG mode, processes, topology, CUDA driver version, nvmlDeviceGetTemperatureV); the partial build
 * plays healthy_h200.
 * Like a driver, it knows what the process does with the GPU through the CUDA runtime: with the fake runtime
 * (fake_cudart.c, FAKE_CUDART_DEVICES=1, found by dlopen(RTLD_NOLOAD) of AMPFORGE_CUDART_LIBRARY) holding pinned
 * memory and copying to the device, the link reads at its busy generation (h200_vm: Gen5); once the process has
 * used the device it is on the compute process list, under its pid plus FAKE_NVML_PID_OFFSET (default 0: a
 * container's PID namespace shows NVML's host pids, which differ from getpid()).
 * FAKE_NVML_SLOT_GEN=G makes nvmlDeviceGetMaxPcieLinkGeneration (GPU and slot) answer G, as a virtual machine's
 * emulated port above the GPU can (below what the link runs at; 0).
 * Test-only code: ampforge never loads it unless AMPFORGE_NVML_LIBRARY points at it. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
  OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, INSUFFICIENT_SIZE = 7, GPU_IS_LOST = 15,
  ARGUMENT_VERSION_MISMATCH = 25, UNKNOWN = 999
};

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } nvmlPciInfo_t;
typedef struct { unsigned int version; int sensorType; int temperature; } nvmlTemperature_t;
/* NVML_STRUCT_VERSION(Temperature, 1) */
#define TEMPERATURE_V1 ((unsigned)sizeof(nvmlTemperature_t) | (1u << 24))

#define NA 0xFFFFFFFFu /* "this board does not support it" */

typedef struct {
  const char* name;
  const char* uuid;
  const char* bus_id;
  int cc_major, cc_minor;
  unsigned long long mem_total, mem_used;
  unsigned sm_clock, sm_clock_max, mem_clock, mem_clock_max;
  unsigned gen, gen_max_system, gen_max_gpu, width, width_max;
  unsigned tx_kbps, rx_kbps;
  unsigned temp, slowdown, shutdown, fan;
  unsigned power_mw, limit_mw;
  unsigned long long reasons;
  int ecc_supported, ecc_enabled;
  unsigned long long ecc_corrected, ecc_uncorrected, ecc_uncorrected_aggregate;
  int persistence;
  unsigned util_gpu, util_mem;
  unsigned nproc;
  nvmlProcessInfo_t procs[2];
  /* runtime state */
  long calls, lose_after; /* lose_after < 0: never */
  /* topology (zero: no NVLink) */
  unsigned nvlinks, nvlink_down_mask;
  unsigned gen_busy; /* the link generation while the fake CUDA runtime copies (0: as idle) */
  int mig;           /* MIG mode: 0 not supported (GeForce), 1 off, 2 on */
} Gpu;

static Gpu g_gpus[2];
static unsigned g_count;
static int g_pair_level = 50; /* nvmlGpuTopologyLevel_t between GPU 0 and GPU 1 */
static const char* g_driver = "570.124.06";
static int g_cuda = 12080;
static int g_initialised;

static const unsigned long long GiB = 1ull << 30;

static Gpu h200(const char* uuid, const char* bus) {
  Gpu g = {"NVIDIA H200", uuid, bus, 9, 0, 143771ull << 20, 1ull << 29, 345, 1980, 2619, 2619,
           5, 5, 5, 16, 16, 1200, 800, 38, 90, 95, NA, 121000, 700000, 0x1,
           1, 1, 0, 0, 0, 1, 0, 0, 0, {{0}}, 0, -1};
  g.mig = 1;
  return g;
}

static void setup(void) {
  const char* s = getenv("FAKE_NVML_SCENARIO");
  if (!s) s = "healthy_h200";
  memset(g_gpus, 0, sizeof(g_gpus));
  g_count = 1;
  g_gpus[0] = h200("GPU-fa4e0000-0000-4000-8000-000000000001", "00000000:18:00.0");
  if (strcmp(s, "rtx4080_gen3x8") == 0) {
    Gpu g = {"NVIDIA GeForce RTX 4080", "GPU-fa4e0000-0000-4000-8000-000000004080", "00000000:01:00.0", 8, 9,
             16ull * GiB, 1ull << 30, 2505, 3105, 11201, 11201, 3, 4, 4, 8, 16, 300, 200, 45, 90, 95, 30,
             35000, 320000, 0x0, 0, 0, 0, 0, 0, 0, 2, 1, 1,
             {{2222, 300ull << 20, NA, NA}}, 0, -1};
    g_gpus[0] = g;
  } else if (strcmp(s, "hot") == 0) {
    Gpu g = {"NVIDIA GeForce RTX 4090", "GPU-fa4e0000-0000-4000-8000-000000004090", "00000000:41:00.0", 8, 9,
             24ull * GiB, 21ull * GiB, 2100, 3120, 10501, 10501, 4, 4, 4, 16, 16, 250000, 90000, 87, 90, 95, 100,
             448000, 450000, 0x20 | 0x40 | 0x4, 0, 0, 0, 0, 0, 1, 99, 40, 1,
             {{31337, 20ull * GiB, 0, 0}}, 0, -1};
    g_gpus[0] = g;
  } else if (strcmp(s, "fanless") == 0) {
    Gpu g = {"NVIDIA L40S", "GPU-fa4e0000-0000-4000-8000-00000000040f", "00000000:3b:00.0", 8, 9,
             46068ull << 20, 600ull << 20, 210, 2520, 9001, 9001, 4, 4, 4, 16, 16, 100, 100, 41, 88, 93, NA,
             36000, 350000, 0x1, 1, 1, 3, 0, 0, 1, 0, 0, 0, {{0}}, 0, -1};
    g_gpus[0] = g;
  } else if (strcmp(s, "old_driver") == 0) {
    Gpu g = h200("GPU-fa4e0000-0000-4000-8000-000000000100", "00000000:65:00.0");
    g.name = "NVIDIA H100 PCIe";
    g.mem_total = 81559ull << 20;
    g.limit_mw = 350000;
    g_gpus[0] = g;
    g_driver = "470.57.02";
    g_cuda = 11040;
  } else if (strcmp(s, "lost") == 0) {
    const char* after = getenv("FAKE_NVML_LOSE_AFTER_CALLS");
    g_count = 2;
    g_gpus[1] = h200("GPU-fa4e0000-0000-4000-8000-000000000002", "00000000:2a:00.0");
    g_gpus[1].lose_after = after ? atol(after) : 20;
  } else if (strcmp(s, "no_gpu") == 0) {
    g_count = 0;
  } else if (strcmp(s, "nvlink_pair") == 0 || strcmp(s, "nvlink_down") == 0) {
    g_count = 2;
    g_gpus[1] = h200("GPU-fa4e0000-0000-4000-8000-000000000002", "00000000:2a:00.0");
    g_gpus[0].nvlinks = g_gpus[1].nvlinks = 4;
    if (strcmp(s, "nvlink_down") == 0) g_gpus[0].nvlink_down_mask = 1u << 2;
    g_pair_level = 50;
  } else if (strcmp(s, "h200_vm") == 0) {
    Gpu* g = &g_gpus[0];
    g->name = "NVIDIA H200";
    g->gen = 1;       /* idle: power saving */
    g->gen_busy = 5;  /* while copies run */
    g->tx_kbps = g->rx_kbps = NA;
    g->temp = 31;
    g->power_mw = 76000;
    g->persistence = 0;
    g->nvlinks = 18;
    g->nvlink_down_mask = (1u << 18) - 1;
    g_driver = "580.95.05";
    g_cuda = 13000;
  } else if (strcmp(s, "pcie_sys") == 0) {
    Gpu g = {"NVIDIA GeForce RTX 4090", "GPU-fa4e0000-0000-4000-8000-000000004091", "00000000:41:00.0", 8, 9,
             24ull * GiB, 1ull << 30, 2100, 3120, 10501, 10501, 4, 4, 4, 16, 16, 100, 100, 40, 90, 95, 30,
             60000, 450000, 0x1, 0, 0, 0, 0, 0, 1, 0, 0, 0, {{0}}, 0, -1};
    g_count = 2;
    g_gpus[0] = g;
    g_gpus[1] = g;
    g_gpus[1].uuid = "GPU-fa4e0000-0000-4000-8000-000000004092";
    g_gpus[1].bus_id = "00000000:c1:00.0";
    g_pair_level = 50;
  }
  if (getenv("FAKE_NVML_SLOT_GEN"))
    g_gpus[0].gen_max_system = g_gpus[1].gen_max_system = (unsigned)atoi(getenv("FAKE_NVML_SLOT_GEN"));
}

/* What the fake CUDA runtime of this process says (0 when it is not loaded): see the file comment. */
static int cudart_says(const char* what) {
  const char* path = getenv("AMPFORGE_CUDART_LIBRARY");
  void* h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
  int (*fn)(void) = h ? (int (*)(void))dlsym(h, what) : NULL;
  const int v = fn ? fn() : 0;
  if (h) dlclose(h);
  return v;
}

/* Every device query goes through here: counts calls, and turns a device past its budget into a lost one. */
static Gpu* dev(void* handle, nvmlReturn_t* r) {
  Gpu* g = (Gpu*)handle;
  *r = OK;
  if (!g_initialised) { *r = UNINITIALIZED; return NULL; }
  if (g < g_gpus || g >= g_gpus + g_count) { *r = INVALID_ARGUMENT; return NULL; }
  g->calls++;
  if (g->lose_after >= 0 && g->calls > g->lose_after) { *r = GPU_IS_LOST; return NULL; }
  return g;
}
#define DEV(h) nvmlReturn_t r_; Gpu* g = dev(h, &r_); if (!g) return r_
#define OPT(value, out) do { if ((value) == NA) return NOT_SUPPORTED; *(out) = (value); return OK; } while (0)

nvmlReturn_t nvmlInit_v2(void) { setup(); g_initialised = 1; return OK; }
nvmlReturn_t nvmlShutdown(void) { g_initialised = 0; return OK; }
const char* nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case OK: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case INSUFFICIENT_SIZE: return "Insufficient Size";
    case GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
  }
}
static nvmlReturn_t copy_str(const char* s, char* out, unsigned len) {
  if (strlen(s) + 1 > len) return INSUFFICIENT_SIZE;
  strcpy(out, s);
  return OK;
}
nvmlReturn_t nvmlSystemGetDriverVersion(char* v, unsigned len) { return copy_str(g_driver, v, len); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned* n) { if (!g_initialised) return UNINITIALIZED; *n = g_count; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, void** h) {
  if (!g_initialised) return UNINITIALIZED;
  if (i >= g_count) return INVALID_ARGUMENT;
  *h = &g_gpus[i];
  return OK;
}
nvmlReturn_t nvmlDeviceGetName(void* h, char* out, unsigned len) { DEV(h); return copy_str(g->name, out, len); }
nvmlReturn_t nvmlDeviceGetUUID(void* h, char* out, unsigned len) { DEV(h); return copy_str(g->uuid, out, len); }
nvmlReturn_t nvmlDeviceGetMemoryInfo(void* h, nvmlMemory_t* m) {
  DEV(h);
  m->total = g->mem_total; m->used = g->mem_used; m->free = g->mem_total - g->mem_used;
  return OK;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(void* h, nvmlUtilization_t* u) { DEV(h); u->gpu = g->util_gpu; u->memory = g->util_mem; return OK; }
nvmlReturn_t nvmlDeviceGetClockInfo(void* h, int type, unsigned* mhz) {
  DEV(h);
  if (type == 1 || type == 0) OPT(g->sm_clock, mhz);
  if (type == 2) OPT(g->mem_clock, mhz);
  return INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetTemperature(void* h, int sensor, unsigned* t) {
  DEV(h);
  if (sensor != 0) return INVALID_ARGUMENT;
  OPT(g->temp, t);
}

/* Exported by the partial build too (with the ones above: about half of the list). */
nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
/* "<CUDA major>.<driver version>", as NVML prints it. */
nvmlReturn_t nvmlSystemGetNVMLVersion(char* v, unsigned len) {
  char buf[96];
  snprintf(buf, sizeof(buf), "%d.%s", g_cuda / 1000, g_driver);
  return copy_str(buf, v, len);
}
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void* h, int* major, int* minor) { DEV(h); *major = g->cc_major; *minor = g->cc_minor; return OK; }
nvmlReturn_t nvmlDeviceGetMaxClockInfo(void* h, int type, unsigned* mhz) {
  DEV(h);
  if (type == 1 || type == 0) OPT(g->sm_clock_max, mhz);
  if (type == 2) OPT(g->mem_clock_max, mhz);
  return INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(void* h, unsigned* v) {
  DEV(h);
  if (g->gen_busy && cudart_says("fake_cudart_link_busy")) OPT(g->gen_busy, v);
  OPT(g->gen, v);
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(void* h, unsigned* v) { DEV(h); OPT(g->width, v); }
nvmlReturn_t nvmlDeviceGetPowerUsage(void* h, unsigned* v) { DEV(h); OPT(g->power_mw, v); }

#ifndef FAKE_NVML_PARTIAL
nvmlReturn_t nvmlDeviceGetTemperatureV(void* h, nvmlTemperature_t* t) {
  DEV(h);
  if (t->version != TEMPERATURE_V1) return ARGUMENT_VERSION_MISMATCH;
  if (t->sensorType != 0) return INVALID_ARGUMENT;
  if (g->temp == NA) return NOT_SUPPORTED;
  t->temperature = (int)g->temp;
  return OK;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* v) { *v = g_cuda; return OK; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* v) { *v = g_cuda; return OK; }
nvmlReturn_t nvmlDeviceGetCount(unsigned* n) { return nvmlDeviceGetCount_v2(n); }
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned i, void** h) { return nvmlDeviceGetHandleByIndex_v2(i, h); }
nvmlReturn_t nvmlDeviceGetPciInfo_v3(void* h, nvmlPciInfo_t* p) {
  DEV(h);
  memset(p, 0, sizeof(*p));
  strcpy(p->busId, g->bus_id);
  return OK;
}
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(void* h, unsigned* v) { DEV(h); OPT(g->gen_max_system, v); }
nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(void* h, unsigned* v) { DEV(h); OPT(g->gen_max_gpu, v); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(void* h, unsigned* v) { DEV(h); OPT(g->width_max, v); }
nvmlReturn_t nvmlDeviceGetPcieThroughput(void* h, int counter, unsigned* v) {
  DEV(h);
  if (counter == 0) OPT(g->tx_kbps, v);
  if (counter == 1) OPT(g->rx_kbps, v);
  return INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetTemperatureThreshold(void* h, int which, unsigned* t) {
  DEV(h);
  if (which == 0) OPT(g->shutdown, t);
  if (which == 1) OPT(g->slowdown, t);
  return NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetFanSpeed(void* h, unsigned* v) { DEV(h); OPT(g->fan, v); }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(void* h, unsigned* v) { DEV(h); OPT(g->limit_mw, v); }
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void* h, unsigned long long* v) { DEV(h); *v = g->reasons; return OK; }
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void* h, unsigned long long* v) { DEV(h); *v = g->reasons; return OK; }
nvmlReturn_t nvmlDeviceGetEccMode(void* h, int* current, int* pending) {
  DEV(h);
  if (!g->ecc_supported) return NOT_SUPPORTED;
  *current = *pending = g->ecc_enabled;
  return OK;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(void* h, int type, int counter, unsigned long long* v) {
  DEV(h);
  if (!g->ecc_supported) return NOT_SUPPORTED;
  if (type == 0) *v = g->ecc_corrected;
  else *v = counter == 0 ? g->ecc_uncorrected : g->ecc_uncorrected_aggregate;
  return OK;
}
nvmlReturn_t nvmlDeviceGetPersistenceMode(void* h, int* v) { DEV(h); *v = g->persistence; return OK; }
nvmlReturn_t nvmlDeviceGetMigMode(void* h, unsigned* current, unsigned* pending) {
  DEV(h);
  if (g->mig == 0) return NOT_SUPPORTED;
  *current = *pending = g->mig == 2;
  return OK;
}
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(void* h1, void* h2, int* level) {
  nvmlReturn_t r1, r2;
  Gpu* a = dev(h1, &r1);
  Gpu* b;
  if (!a) return r1;
  b = dev(h2, &r2);
  if (!b) return r2;
  *level = a == b ? 0 : g_pair_level;
  return OK;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(void* h, unsigned link, int* active) {
  DEV(h);
  if (g->nvlinks == 0) return NOT_SUPPORTED;
  if (link >= g->nvlinks) return INVALID_ARGUMENT;
  *active = (g->nvlink_down_mask >> link) & 1u ? 0 : 1;
  return OK;
}
/* The other end of every link is the other GPU (upper-case hex, as some drivers print it). */
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(void* h, unsigned link, nvmlPciInfo_t* p) {
  Gpu* peer;
  char* c;
  DEV(h);
  if (g->nvlinks == 0) return NOT_SUPPORTED;
  if (link >= g->nvlinks) return INVALID_ARGUMENT;
  peer = g == &g_gpus[0] ? &g_gpus[1] : &g_gpus[0];
  /* An inactive link, or one without a GPU at its end: nothing to say (ampforge asks only for active ones). */
  if (((g->nvlink_down_mask >> link) & 1u) || peer >= g_gpus + g_count || !peer->bus_id) return NOT_SUPPORTED;
  memset(p, 0, sizeof(*p));
  strcpy(p->busId, peer->bus_id);
  for (c = p->busId; *c; ++c)
    if (*c >= 'a' && *c <= 'f') *c = (char)(*c - 'a' + 'A');
  return OK;
}
static nvmlReturn_t procs(Gpu* g, unsigned* count, nvmlProcessInfo_t* out, int graphics) {
  unsigned n = 0, i;
  const int self = !graphics && g == &g_gpus[0] && cudart_says("fake_cudart_has_context");
  for (i = 0; i < g->nproc; ++i) n += (g->procs[i].gpuInstanceId == NA) == graphics;
  n += self;
  if (*count < n) { *count = n; return INSUFFICIENT_SIZE; }
  *count = 0;
  for (i = 0; i < g->nproc; ++i)
    if ((g->procs[i].gpuInstanceId == NA) == graphics) out[(*count)++] = g->procs[i];
  if (self) {
    const char* offset = getenv("FAKE_NVML_PID_OFFSET");
    nvmlProcessInfo_t me = {(unsigned)getpid() + (unsigned)(offset ? atoi(offset) : 0), 512ull << 20, NA, NA};
    out[(*count)++] = me;
  }
  return OK;
}
/* A process listed with gpuInstanceId NA is a graphics process in this fake; others are compute. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void* h, unsigned* count, nvmlProcessInfo_t* out) { DEV(h); return procs(g, count, out, 0); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(void* h, unsigned* count, nvmlProcessInfo_t* out) { DEV(h); return procs(g, count, out, 1); }
#endif
