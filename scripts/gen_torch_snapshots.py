#!/usr/bin/env python3
"""Writes PyTorch-style memory snapshots with Python's own pickle module, for the snapshot reader's tests.

usage: /usr/bin/python3 scripts/gen_torch_snapshots.py            the committed fixtures:
           tests/data/torch_snapshots/*.pickle and the fuzz seeds tests/fuzz/torch_snapshot/seeds/
       /usr/bin/python3 scripts/gen_torch_snapshots.py --big N OUT  a random N-entry snapshot (timings)

No torch needed. Each snapshot has the shape `torch.cuda.memory._snapshot()` returns (torch/csrc/cuda/Module.cpp:
segments, device_traces, allocator_settings, external_annotations) and is written as `_dump_snapshot` writes it
(pickle.dump, default protocol; the old-format one with protocol 2). The entries are what PyTorch's
CUDACachingAllocator records for the requests listed: the segment entries and final segments below were worked out
by hand from its rules (c10/cuda/CUDACachingAllocator.cpp: 512-byte rounding, roundup_power2_divisions, 2 MiB small
segments, 20 MiB segments for 1-10 MiB, 2 MiB-rounded large segments, the split and oversize rules, expandable
segments mapping 20 MiB pages in the large pool and 2 MiB pages in the small one), and the C++ tests
(src/ampforge/memory/torch_snapshot_test.cpp) hold the replay to the same figures.
"""
import pickle
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "torch_snapshots"
SEEDS = ROOT / "tests" / "fuzz" / "torch_snapshot" / "seeds"
MiB = 1 << 20
BASE = 0x7F0000000000      # device addresses as PyTorch reports them (ints above 2^31: LONG1 in the pickle)
STREAM = 94823012345600    # a cudaStream_t as an int

TORCH_FRAMES = [
    {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/conv.py", "line": 456, "name": "_conv_forward"},
    {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 1747, "name": "_call_impl"},
]


# What _record_memory_history(context="all") records before the Python frames: the allocator's own C++ frames and
# the dispatcher's, with bare file names or none, and the interpreter's frames between the Python ones.
CPP_FRAMES = [
    {"filename": "??", "line": 0, "name": "torch::unwind::unwind()"},
    {"filename": "memory_snapshot.cpp", "line": 0, "name": "torch::cuda::(anonymous namespace)::gather_with_cpp()"},
    {"filename": "CUDACachingAllocator.cpp", "line": 0,
     "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long, CUstream_st*)"},
    {"filename": "", "line": 0, "name": "at::TensorBase at::detail::_empty_strided_generic<c10::ArrayRef<long> >()"},
    {"filename": "RegisterCUDA.cpp", "line": 0, "name": "at::(anonymous namespace)::wrapper_CUDA__empty_strided()"},
    {"filename": "python_variable_methods.cpp", "line": 0, "name": "torch::autograd::THPVariable_to()"},
    {"filename": "??", "line": 0, "name": "_PyEval_EvalFrameDefault"},
]
# A library between the user's line and PyTorch (einops, transformers, ...): the user's line is still the site.
LIBRARY_FRAME = {"filename": "/home/u/.venv/lib/python3.12/site-packages/einops/einops.py", "line": 905, "name": "rearrange"}


def frames(line, name, cpp=False):
    head = CPP_FRAMES + [LIBRARY_FRAME] if cpp else TORCH_FRAMES
    return head + [{"filename": "train.py", "line": line, "name": name},
                   {"filename": "train.py", "line": 120, "name": "main"}]


def settings(expandable=False, max_split=-1, divisions=None):
    div = {str(1 << k): 0 for k in range(16)}
    div.update(divisions or {})
    return {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": max_split, "garbage_collection_threshold": 0.0,
            "expandable_segments": expandable, "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False, "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": div}


class Trace:
    def __init__(self, new=True):
        self.entries, self.t, self.new = [], 1_700_000_000_000_000, new

    def add(self, action, addr, size, stream=0, fr=None, key="addr"):
        e = {"action": action, key: addr, "size": size, "stream": stream}
        if self.new:
            self.t += 10
            e["time_us"] = self.t
            e["frames"] = fr or []
            e["compile_context"] = "N/A"
            e["user_metadata"] = ""
        self.entries.append(e)

    def alloc(self, addr, size, stream=0, fr=None):
        self.add("alloc", addr, size, stream, fr)

    def free(self, addr, size, stream=0):
        self.add("free_requested", addr, size, stream)
        self.add("free_completed", addr, size, stream)


def segment(addr, blocks, stream=0, large=True, expandable=False, device=0):
    total = sum(b[1] for b in blocks)
    out, a = [], addr
    for state, size, req in blocks:
        out.append({"address": a, "size": size, "requested_size": req, "state": state, "frames": []})
        a += size
    act = sum(b[1] for b in blocks if b[0] != "inactive")
    return {"device": device, "address": addr, "total_size": total, "allocated_size": act, "active_size": act,
            "requested_size": sum(b[2] for b in blocks if b[0] != "inactive"), "stream": stream,
            "segment_type": "large" if large else "small", "segment_pool_id": (0, 0), "is_expandable": expandable,
            "frames": [], "blocks": out}


def snap(segments, trace, sett=None, **extra):
    d = {"segments": segments, "device_traces": [trace.entries]}
    if sett is not None:
        d["allocator_settings"] = sett
        d["external_annotations"] = []
    d.update(extra)
    return d


def new_basic():
    # 512-byte rounding and 2 MiB-rounded large segments; a small request gets a 2 MiB small segment.
    t = Trace()
    s1, s2, s3 = BASE, BASE + 402 * MiB, BASE + 702 * MiB
    t.add("segment_alloc", s1, 402 * MiB)
    t.alloc(s1, 400 * MiB + 1000, fr=frames(42, "forward"))     # 400 MiB + 1024 after rounding; remainder split off
    t.add("segment_alloc", s2, 300 * MiB)
    t.alloc(s2, 300 * MiB, fr=frames(57, "backward", cpp=True))
    t.free(s1, 400 * MiB + 1000)
    t.alloc(s1, 350 * MiB, fr=frames(42, "forward"))            # reuses the 402 MiB block (split)
    t.add("segment_alloc", s3, 2 * MiB)
    t.alloc(s3, 1000, fr=frames(77, "loss"))                    # small pool
    segs = [segment(s1, [("active_allocated", 350 * MiB, 350 * MiB), ("inactive", 52 * MiB, 0)]),
            segment(s2, [("active_allocated", 300 * MiB, 300 * MiB)]),
            segment(s3, [("active_allocated", 1024, 1000), ("inactive", 2 * MiB - 1024, 0)], large=False)]
    return snap(segs, t, settings())


def old_format():
    # PyTorch 2.0-style: no time_us, frames, allocator_settings; blocks without addresses. 1-10 MiB requests
    # take 20 MiB segments; a 1 MiB remainder is not split off (it must be more than 1 MiB).
    t = Trace(new=False)
    s1, s2 = BASE, BASE + 20 * MiB
    t.add("segment_alloc", s1, 20 * MiB)
    t.alloc(s1, 5 * MiB)
    t.alloc(s1 + 5 * MiB, 8 * MiB)
    t.add("segment_alloc", s2, 20 * MiB)
    t.alloc(s2, 9 * MiB)
    t.free(s1, 5 * MiB)
    t.alloc(s1 + 13 * MiB, 6 * MiB)  # takes the 7 MiB block whole
    segs = [segment(s1, [("inactive", 5 * MiB, 0), ("active_allocated", 8 * MiB, 8 * MiB),
                         ("active_allocated", 7 * MiB, 6 * MiB)]),
            segment(s2, [("active_allocated", 9 * MiB, 9 * MiB), ("inactive", 11 * MiB, 0)])]
    for s in segs:
        for b in s["blocks"]:
            del b["address"], b["frames"], b["requested_size"]
        del s["segment_pool_id"], s["is_expandable"], s["frames"], s["requested_size"]
    return {"segments": segs, "device_traces": [t.entries]}


def streams():
    # Two streams; a block used on the other stream (record_stream) is reusable only at free_completed.
    t = Trace()
    s1, s2, s3 = BASE, BASE + 100 * MiB, BASE + 200 * MiB
    t.add("segment_alloc", s1, 100 * MiB)
    t.alloc(s1, 100 * MiB)
    t.add("segment_alloc", s2, 100 * MiB, STREAM)
    t.alloc(s2, 100 * MiB, STREAM)
    t.add("free_requested", s1, 100 * MiB)                      # still in use on STREAM
    t.add("segment_alloc", s3, 100 * MiB)
    t.alloc(s3, 100 * MiB)                                      # cannot take s1 yet
    t.add("free_completed", s1, 100 * MiB)
    t.free(s2, 100 * MiB, STREAM)
    t.alloc(s1, 100 * MiB)                                      # now it can
    t.alloc(s2, 60 * MiB, STREAM)                               # the other stream's block, split
    segs = [segment(s1, [("active_allocated", 100 * MiB, 100 * MiB)]),
            segment(s2, [("active_allocated", 60 * MiB, 60 * MiB), ("inactive", 40 * MiB, 0)], stream=STREAM),
            segment(s3, [("active_allocated", 100 * MiB, 100 * MiB)])]
    return snap(segs, t, settings())


def expandable():
    # expandable_segments:True: one segment per stream and pool grows by pages (20 MiB large, 2 MiB small).
    t = Trace()
    base, small = BASE, BASE + (1 << 40)
    t.add("segment_map", base, 40 * MiB)
    t.alloc(base, 30 * MiB)
    t.add("segment_map", base + 40 * MiB, 20 * MiB)
    t.alloc(base + 30 * MiB, 25 * MiB)
    t.free(base, 30 * MiB)
    t.alloc(base, 28 * MiB)
    t.add("segment_map", small, 2 * MiB)
    t.alloc(small, 4096)
    segs = [segment(base, [("active_allocated", 28 * MiB, 28 * MiB), ("inactive", 2 * MiB, 0),
                           ("active_allocated", 25 * MiB, 25 * MiB), ("inactive", 5 * MiB, 0)], expandable=True),
            segment(small, [("active_allocated", 4096, 4096), ("inactive", 2 * MiB - 4096, 0)], large=False,
                    expandable=True)]
    return snap(segs, t, settings(expandable=True))


def oom():
    # Two 500 MiB segments each pinned by a live block: 450 MiB free in the cache, the largest piece 300 MiB, and
    # 100 MiB free on the device. A 400 MiB request fails; expandable segments would have served it.
    t = Trace()
    s1, s2 = BASE, BASE + 500 * MiB
    t.add("segment_alloc", s1, 500 * MiB)
    t.alloc(s1, 500 * MiB, fr=frames(30, "warmup"))
    t.free(s1, 500 * MiB)
    t.alloc(s1, 200 * MiB, fr=frames(42, "forward"))
    t.add("segment_alloc", s2, 500 * MiB)
    t.alloc(s2, 500 * MiB, fr=frames(50, "workspace"))
    t.free(s2, 500 * MiB)
    t.alloc(s2, 350 * MiB, fr=frames(57, "backward"))
    t.add("oom", 100 * MiB, 400 * MiB, fr=frames(61, "optimizer_step"), key="device_free")
    t.free(s1, 200 * MiB)
    t.free(s2, 350 * MiB)
    t.alloc(s1, 100 * MiB, fr=frames(70, "retry"))
    segs = [segment(s1, [("active_allocated", 100 * MiB, 100 * MiB), ("inactive", 400 * MiB, 0)]),
            segment(s2, [("inactive", 500 * MiB, 0)])]
    return snap(segs, t, settings())


def wrapped():
    # The ring buffer kept its last 7 entries: the 200 MiB segment and its two blocks P1 (freed first in the
    # trace, its free_requested lost) and P2 (alive to the end) predate them.
    t = Trace()
    s1, s2 = BASE, BASE + 200 * MiB
    t.add("free_completed", s1, 120 * MiB)                      # P1
    t.alloc(s1, 100 * MiB)
    t.add("segment_alloc", s2, 150 * MiB)
    t.alloc(s2, 150 * MiB)
    t.free(s1, 100 * MiB)
    t.alloc(s1, 110 * MiB)
    segs = [segment(s1, [("active_allocated", 110 * MiB, 110 * MiB), ("inactive", 10 * MiB, 0),
                         ("active_allocated", 80 * MiB, 80 * MiB)]),          # P2 at s1 + 120 MiB
            segment(s2, [("active_allocated", 150 * MiB, 150 * MiB)])]
    return snap(segs, t, settings(), trace_alloc_max_entries=len(t.entries), trace_alloc_overflowed=True)


def rounding():
    # roundup_power2_divisions 4 for [256, 512) MiB and max_split_size 200 MiB.
    t = Trace()
    s1, s2 = BASE, BASE + 320 * MiB
    t.add("segment_alloc", s1, 320 * MiB)
    t.alloc(s1, 300 * MiB + 1)           # rounds to 320 MiB (steps of 64 MiB between 256 and 512)
    t.free(s1, 300 * MiB + 1)
    t.add("segment_alloc", s2, 150 * MiB)
    t.alloc(s2, 150 * MiB)               # below max_split_size: the oversize 320 MiB block may not serve it
    t.alloc(s1, 310 * MiB)               # rounds to 320 MiB: the oversize block serves it (less than 20 MiB larger)
    segs = [segment(s1, [("active_allocated", 320 * MiB, 310 * MiB)]),
            segment(s2, [("active_allocated", 150 * MiB, 150 * MiB)])]
    return snap(segs, t, settings(max_split=200 * MiB, divisions={"256": 4}))


class Global:  # pickled by reference: GLOBAL/STACK_GLOBAL + REDUCE/NEWOBJ
    pass


# Backward runs on the autograd engine's threads: C++ frames only, the node (MmBackward0) or the engine itself.
ENGINE_FRAMES = [
    {"filename": "??", "line": 0, "name": "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)"},
    {"filename": "??", "line": 0, "name": "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"},
    {"filename": "thread48.o", "line": 0, "name": "execute_native_thread_routine"},
    {"filename": "??", "line": 0, "name": "start_thread"},
]


def second_device():
    # Device 0 recorded nothing (its list is empty), device 1 a backward pass: replayed by default, and its sites
    # are the autograd node (MmBackward0) and, for a gradient the engine itself reduced, the engine.
    t = Trace()
    node = {"filename": "??", "line": 0, "name": "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)"}
    t.add("segment_alloc", BASE, 20 * MiB)
    t.alloc(BASE, 6 * MiB, fr=CPP_FRAMES[:4] + [node] + ENGINE_FRAMES)
    t.alloc(BASE + 6 * MiB, 2 * MiB, fr=CPP_FRAMES[:4] + ENGINE_FRAMES)
    # Device 2 recorded too (one 4 MiB block): the report of device 1 names it.
    t2 = Trace()
    t2.add("segment_alloc", BASE, 20 * MiB)
    t2.alloc(BASE, 4 * MiB, fr=frames(88, "forward"))
    segs = [segment(BASE, [("active_allocated", 6 * MiB, 6 * MiB), ("active_allocated", 2 * MiB, 2 * MiB),
                           ("inactive", 12 * MiB, 0)], device=1),
            segment(BASE, [("active_allocated", 4 * MiB, 4 * MiB), ("inactive", 16 * MiB, 0)], device=2)]
    return {"segments": segs, "device_traces": [[], t.entries, t2.entries], "allocator_settings": settings(),
            "external_annotations": []}


def empty_cache():
    # The recording starts with empty_cache() giving back a 40 MiB cached segment from before it (no replay can know
    # it: the recorded peak is counted after it); an 8 MiB request takes a 20 MiB segment; after its free, a second
    # empty_cache() gives that segment back, so the next 8 MiB request needs a new one. Reserved: 40 at the start,
    # then 0, 20, 0, 20 MiB; the peak after the first give-back is 20 MiB.
    t = Trace()
    s0, s1, s2 = BASE, BASE + 40 * MiB, BASE + 60 * MiB
    t.add("segment_free", s0, 40 * MiB)
    t.add("segment_alloc", s1, 20 * MiB)
    t.alloc(s1, 8 * MiB, fr=frames(30, "forward"))
    t.free(s1, 8 * MiB)
    t.add("segment_free", s1, 20 * MiB)
    t.add("segment_alloc", s2, 20 * MiB)
    t.alloc(s2, 8 * MiB, fr=frames(31, "forward"))
    segs = [segment(s2, [("active_allocated", 8 * MiB, 8 * MiB), ("inactive", 12 * MiB, 0)])]
    return snap(segs, t, settings())


def no_history():
    # torch.cuda.memory._snapshot() without _record_memory_history(): empty traces, only the state when taken.
    segs = [segment(BASE, [("active_allocated", 4 * MiB, 4 * MiB), ("inactive", 16 * MiB, 0)], device=1)]
    return {"segments": segs, "device_traces": [[], []], "allocator_settings": settings(), "external_annotations": []}


def bad_inputs(good):
    out = {}
    out["bad_truncated.pickle"] = good[: len(good) // 2]
    # A hand-made pickle that would call os.system: GLOBAL 'posix system', then REDUCE.
    out["bad_global.pickle"] = b"\x80\x02cposix\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03."
    # REDUCE (call the object below with the tuple on top), hand-made so that it is the first opcode refused.
    out["bad_reduce.pickle"] = b"\x80\x02]q\x00)R."
    # What pickle writes for a class instance: STACK_GLOBAL, then NEWOBJ.
    out["bad_object.pickle"] = pickle.dumps({"device_traces": [[]], "x": Global()}, protocol=4)
    out["bad_top_list.pickle"] = pickle.dumps([{"device_traces": []}], protocol=4)
    out["bad_no_traces.pickle"] = pickle.dumps({"segments": []}, protocol=4)
    neg = Trace()
    neg.alloc(BASE, -4096)
    out["bad_negative_size.pickle"] = pickle.dumps(snap([], neg, settings()), protocol=4)
    big = Trace()
    big.alloc(BASE, 1 << 60)
    out["bad_absurd_size.pickle"] = pickle.dumps(snap([], big, settings()), protocol=4)
    dbl = Trace()
    dbl.add("segment_alloc", BASE, 2 * MiB)
    dbl.alloc(BASE, 4096)
    dbl.free(BASE, 4096)
    dbl.add("free_completed", BASE, 4096)   # the same block freed again
    out["bad_unknown_free.pickle"] = pickle.dumps(snap([], dbl, settings()), protocol=4)
    return out


def big_snapshot(n, path):
    """n trace entries: random sizes (512 B to 256 MiB, log-uniform) and lifetimes on two streams."""
    rng = random.Random(1)
    t = Trace()
    live, addr = [], BASE
    while len(t.entries) < n:
        if live and (len(live) > 400 or rng.random() < 0.45):
            a, size, s = live.pop(rng.randrange(len(live)))
            t.free(a, size, s)
        else:
            size = int(2 ** rng.uniform(9, 28))
            s = STREAM if rng.random() < 0.1 else 0
            t.alloc(addr, size, s, fr=frames(rng.randrange(10, 400), "step"))
            live.append((addr, size, s))
            addr += (size + 511) // 512 * 512
    del t.entries[n:]
    Path(path).write_bytes(pickle.dumps(snap([], t, settings())))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--big" and sys.argv[2].isdigit():
        big_snapshot(int(sys.argv[2]), sys.argv[3])
        return
    if len(sys.argv) > 1:  # --help, or anything else: the usage, and nothing is rewritten
        usage = __doc__.split("\n\n")[1]
        print(usage, file=sys.stdout if sys.argv[1] in ("-h", "--help") else sys.stderr)
        sys.exit(0 if sys.argv[1] in ("-h", "--help") else 2)
    OUT.mkdir(parents=True, exist_ok=True)
    SEEDS.mkdir(parents=True, exist_ok=True)
    files = {
        "new_basic.pickle": pickle.dumps(new_basic()),
        "old_format.pickle": pickle.dumps(old_format(), protocol=2),
        "streams.pickle": pickle.dumps(streams()),
        "expandable.pickle": pickle.dumps(expandable(), protocol=5),
        "oom.pickle": pickle.dumps(oom()),
        "wrapped.pickle": pickle.dumps(wrapped(), protocol=3),
        "rounding.pickle": pickle.dumps(rounding()),
        "second_device.pickle": pickle.dumps(second_device()),
        "empty_cache.pickle": pickle.dumps(empty_cache()),
        "no_history.pickle": pickle.dumps(no_history()),
    }
    files.update(bad_inputs(files["new_basic.pickle"]))
    for name, data in sorted(files.items()):
        (OUT / name).write_bytes(data)
        (SEEDS / name.replace(".pickle", "")).write_bytes(data)
        print(f"{OUT.relative_to(ROOT) / name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
