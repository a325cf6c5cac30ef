#!/usr/bin/env python3
"""Small, bounded summaries for scripts/gpu-check (the summary file must stay short; logs go in the tarball).

    gpu_check_report.py suites JUNIT_XML [JSON_OUT] [--brief]   per-suite passed/failed/skipped (--brief: only
                                                     suites with failures or skips), failures with their message
    gpu_check_report.py parity GTEST_STDOUT            worst CUDA-vs-CPU ratios per dtype (AMPFORGE_PARITY_VERBOSE)
    gpu_check_report.py train TSV                      the training table, CUDA beside the CPU reference
    gpu_check_report.py trainrow JSON MODEL DEVICE PRECISION GRAPHS EXIT   one TSV row from `train --json`

Standard library only (it runs under whatever python3 the GPU machine has).
"""
import collections
import json
import re
import sys
import xml.etree.ElementTree as ET


def suite_of(name):
    # ctest names are "label:Suite.Test" or "label:Prefix/Suite.Test/param"
    label, _, rest = name.partition(":")
    if not rest:
        label, rest = "", name
    return (label + ":" if label else "") + rest.split(".")[0]


def first_failure_line(text):
    for line in (text or "").splitlines():
        if "Failure" in line or "error" in line.lower() or "FAILED" in line or "Expected" in line:
            return line.strip()[:240]
    lines = [l for l in (text or "").splitlines() if l.strip()]
    return lines[-1].strip()[:240] if lines else ""


def suites(path, json_out=None, brief=False):
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        print(f"  (no readable results in {path}: {e})")
        return 1
    counts = collections.OrderedDict()
    failures = []
    for tc in root.iter("testcase"):
        name = tc.get("name", "?")
        s = suite_of(name)
        c = counts.setdefault(s, {"passed": 0, "failed": 0, "skipped": 0, "seconds": 0.0})
        c["seconds"] += float(tc.get("time", 0) or 0)
        status = tc.get("status", "")
        if tc.find("failure") is not None or tc.find("error") is not None or status == "fail":
            c["failed"] += 1
            out = tc.find("system-out")
            msg = tc.find("failure")
            text = (msg.get("message", "") if msg is not None else "") + "\n" + (out.text if out is not None else "")
            failures.append((name, first_failure_line(text)))
        elif tc.find("skipped") is not None or status in ("notrun", "disabled"):
            c["skipped"] += 1
        else:
            c["passed"] += 1
    tot = {k: sum(c[k] for c in counts.values()) for k in ("passed", "failed", "skipped")}
    print(f"  total: {tot['passed']} passed, {tot['failed']} failed, {tot['skipped']} skipped")
    for s, c in counts.items():
        if brief and not c["failed"] and not c["skipped"]:
            continue
        flag = "  FAIL" if c["failed"] else ""
        print(f"  {s:<48} {c['passed']:>4} passed {c['failed']:>4} failed {c['skipped']:>4} skipped "
              f"{c['seconds']:7.1f}s{flag}")
    for name, line in failures[:25]:
        print(f"  FAILED {name}: {line}")
    if len(failures) > 25:
        print(f"  ... and {len(failures) - 25} more failures (logs.tar.gz)")
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"totals": tot, "suites": counts, "failures": [n for n, _ in failures]}, f, indent=1)
    return 0


def parity(path):
    worst = collections.defaultdict(list)
    pat = re.compile(r"^cuda-parity-ratio (\S+) (.*) max_ratio (\S+) max_abs_err (\S+)")
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError as e:
        print(f"  (no parity output: {e})")
        return 1
    for line in lines:
        m = pat.match(line)
        if m:
            try:
                worst[m.group(1)].append((float(m.group(3)), m.group(2)))
            except ValueError:
                worst[m.group(1)].append((float("inf"), m.group(2)))
    if not worst:
        print("  no ratios printed (no comparison ran)")
    for dt, vals in sorted(worst.items()):
        vals.sort(reverse=True)
        print(f"  {dt}: {len(vals)} comparisons; the closest to their tolerance (ratio 1 = at the bound):")
        for r, what in vals[:5]:
            print(f"    {r:8.3g}  {what[:150]}")
    return 0


def train(path):
    rows = []
    try:
        for line in open(path):
            if line.strip() and not line.startswith("#"):
                rows.append(line.rstrip("\n").split("\t"))
    except OSError as e:
        print(f"  (no training results: {e})")
        return 1
    cols = ["model", "device", "precision", "graphs", "exit", "accuracy", "steps", "samples/s", "host_syncs",
            "graph nodes", "graph kernels", "launches/step", "peak MiB", "wall s"]
    print("  " + " | ".join(cols))
    for r in rows:
        print("  " + " | ".join(r))
    return 0


def trainrow(path, model, device, precision, graphs, rc):
    j = {}
    try:
        for line in open(path, errors="replace"):
            line = line.strip()
            if line.startswith("{"):
                j = json.loads(line)
    except (OSError, ValueError):
        j = {}
    g = j.get("cuda_graph", {}) or {}
    def num(v, fmt):
        return fmt.format(v) if isinstance(v, (int, float)) else "-"
    row = [model, device, precision, graphs, rc,
           num(100 * j["test_accuracy"], "{:.2f}%") if "test_accuracy" in j else "-",
           num(j.get("steps"), "{}"), num(j.get("train_samples_per_sec"), "{:.0f}"),
           num(j.get("host_syncs"), "{}"), num(g.get("nodes"), "{}"), num(g.get("kernels"), "{}"),
           num(g.get("launches_per_step"), "{}"),
           num(j["peak_memory_bytes"] / 2**20, "{:.1f}") if isinstance(j.get("peak_memory_bytes"), (int, float)) else "-",
           num(j.get("wall_seconds"), "{:.1f}")]
    print("\t".join(str(x) for x in row))
    return 0


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    what = argv[1]
    if what == "suites":
        rest = [a for a in argv[3:] if a != "--brief"]
        return suites(argv[2], rest[0] if rest else None, "--brief" in argv[3:])
    if what == "parity":
        return parity(argv[2])
    if what == "train":
        return train(argv[2])
    if what == "trainrow" and len(argv) == 8:
        return trainrow(*argv[2:8])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
