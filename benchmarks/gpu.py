"""The GPU path: probe contexts per second and fine-tuning step time on one device.

    python3 benchmarks/gpu.py [--device auto|cpu|cuda] [--tasks breast_cancer digits] [--reps 3]
                              [--write-json PATH] [--from-json PATH] [--no-write]

Models: the shipped pfn-mini and random-init TabICL and TabPFN v2 at their packages' default (production)
architecture, built with ``build_model(name, weights="random")``: speed does not depend on what the
weights know. Per model and task (prepared by Stage I, Q members and Q non-members, context C'):

* **probe**: ``probes.scoring.score`` of the default 48-manipulation suite, as a probe actor runs it
  (plan built once, rows compressed for models that take multiplicities, the invariance shortcut on),
  on the device the model lives on; batches as large as the device holds (``score`` halves them on an
  out-of-memory error). Reported: contexts scored per second, contexts actually forwarded per second,
  the forward's matrix FLOPs (``FlopCounterMode``) per second and as a share of the device's float32
  matmul rate, peak device memory.
* **fine-tune step**: one ``Finetuner.step`` (forward on context C' with the Q member queries, loss,
  backward, clipping, AdamW) in milliseconds, median of the timed steps after two warm-up steps.

On a machine without a GPU the script still runs, on the CPU, at a small size (few queries, small
context), and says that no GPU was present. ``--write-json`` saves the raw figures (for a GPU machine
whose results come back as a file); ``--from-json`` renders a saved file into RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import count_flops, matmul_rate, md_table, publish, versions  # noqa: E402

SECTION = "GPU path: probe contexts/s and fine-tune step time"
CASES = (  # (label, registered name, build options, package it needs)
    ("pfn-mini (shipped)", "pfn-mini", {"weights": "shipped"}, None),
    ("tabicl (default arch., random init)", "tabicl", {"weights": "random"}, "tabicl"),
    ("tabpfn-v2 (default arch., random init)", "tabpfn-v2", {"weights": "random"}, "tabpfn"),
)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_reset(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def probe_case(name: str, options: dict[str, Any], task: Any, device, reps: int) -> dict[str, Any]:
    from probes.manipulations import default_suite
    from probes.scoring import ProbePlan, ProbeQueries, score
    from trainables.models import build_model

    model = build_model(name, **options).to(device)
    model.module.eval()
    plan = ProbePlan.build(ProbeQueries.from_task(task), default_suite(), task.seed,
                           compress_rows=model.supports_context_weights)
    rep = plan.representatives(model.invariances)
    forwarded = int((rep == range(len(rep))).sum())
    forward_seconds = [0.0]

    def timed(original):
        def timed_forward(*args, **kwargs):
            _sync(device)
            start = time.perf_counter()
            out = original(*args, **kwargs)
            _sync(device)
            forward_seconds[0] += time.perf_counter() - start
            return out

        return timed_forward

    score(model, plan)  # warm-up: kernels, allocator, the plan's shortcut tables
    flops, _ = count_flops(lambda: score(model, plan), model.module)
    # score calls log_probs, or log_probs_many where the model packs batches (pfn-mini on a CPU)
    model.log_probs, model.log_probs_many = timed(model.log_probs), timed(model.log_probs_many)
    _peak_reset(device)
    seconds, forwards = [], []
    for _ in range(reps):
        forward_seconds[0] = 0.0
        _sync(device)
        start = time.perf_counter()
        score(model, plan)
        _sync(device)
        seconds.append(time.perf_counter() - start)
        forwards.append(forward_seconds[0])
    del model.log_probs, model.log_probs_many
    s, f = statistics.median(seconds), statistics.median(forwards)
    return {"contexts": len(plan.planned), "forwarded": forwarded, "score_s": s, "forward_s": f,
            "contexts_per_s": len(plan.planned) / s, "forwarded_per_s": forwarded / s,
            "flops": flops, "forward_flop_rate": flops / f, "peak_gib": _peak_gib(device)}


def finetune_case(name: str, options: dict[str, Any], task: Any, device, steps: int) -> dict[str, Any]:
    from trainables.finetune import Finetuner, FinetuneSpec

    finetuner = Finetuner(FinetuneSpec(model=name, model_options=options, epochs=10_000, lr=1e-5), [task],
                          device=device)
    batch = finetuner.batches(1)[0]
    _peak_reset(device)
    for _ in range(2):
        finetuner.step(batch)
    times = []
    for _ in range(steps):
        _sync(device)
        start = time.perf_counter()
        finetuner.step(batch)
        _sync(device)
        times.append(time.perf_counter() - start)
    params = sum(p.numel() for p in finetuner.model.trainable_parameters())
    return {"step_ms": 1e3 * statistics.median(times), "steps": steps, "params": params,
            "context_rows": int(batch.context_x.shape[1]), "queries": int(batch.query_x.shape[1]),
            "peak_gib": _peak_gib(device)}


def measure(args) -> dict[str, Any]:
    import importlib.util

    import torch

    from trainables.data import TaskSource, prepare_task
    from trainables.models.base import resolve_device

    device = resolve_device(None if args.device == "auto" else args.device)
    on_gpu = device.type == "cuda"
    q, context, reps, steps = (args.q, args.context, args.reps, args.steps) if on_gpu else (3, 32, 1, 2)
    if not on_gpu:
        torch.set_num_threads(args.threads)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if on_gpu else f"CPU ({platform.machine()}, "
                                                                   f"{torch.get_num_threads()} thread(s))",
        "gpu_present": torch.cuda.is_available(), "on_gpu": on_gpu, "torch": torch.__version__,
        "python": platform.python_version(), "versions": versions(("tabicl", "tabpfn")),
        "q": q, "context": context, "reps": reps, "steps": steps, "cases": [],
    }
    if on_gpu:
        # TF32 off: iclmem's scores are float32, so the limit is the float32 rate
        result["matmul_fp32_flops"] = matmul_rate(8192, 8192, 8192, device)
    else:
        result["matmul_fp32_flops"] = matmul_rate(1024, 1024, 1024, device)
    print(f"device: {result['device']}; float32 matmul {result['matmul_fp32_flops'] / 1e12:.2f} TFLOP/s", flush=True)
    tasks = {t: prepare_task(TaskSource(t, "builtin"), seed=0, q=q, context_size=context)
             for t in (args.tasks if on_gpu else args.tasks[:1])}
    for label, name, options, package in CASES:
        if package and importlib.util.find_spec(package) is None:
            result["cases"].append({"label": label, "skipped": f"package {package!r} not installed"})
            print(f"{label}: skipped ({package} not installed)", flush=True)
            continue
        for task_name, task in tasks.items():
            started = time.perf_counter()
            row: dict[str, Any] = {"label": label, "model": name, "task": task_name}
            try:
                row["probe"] = probe_case(name, options, task, device, reps)
                row["finetune"] = finetune_case(name, options, task, device, steps)
            except Exception as exc:  # a failure is a result too: record it and go on to the next case
                row["error"] = f"{type(exc).__name__}: {exc}"[:500]
            row["wall_s"] = time.perf_counter() - started
            result["cases"].append(row)
            print(json.dumps(row, default=float), flush=True)
    return result


def render(result: dict[str, Any]) -> str:
    peak = result["matmul_fp32_flops"]
    rows = []
    for case in result["cases"]:
        if "skipped" in case or "error" in case:
            rows.append((case["label"], case.get("task", "–"), case.get("skipped") or case.get("error"),
                         *["–"] * 7))
            continue
        p, f = case["probe"], case["finetune"]
        mem = max(x for x in (p["peak_gib"], f["peak_gib"], 0.0) if x is not None)
        rows.append((case["label"], case["task"], f"{p['contexts_per_s']:,.0f}", f"{p['forwarded_per_s']:,.0f}",
                     f"{p['contexts']} ({p['forwarded']} forwarded)",
                     f"{p['forward_flop_rate'] / 1e12:.3f}", f"{p['forward_flop_rate'] / peak:.1%}",
                     f"{f['step_ms']:,.1f}", f"{f['params'] / 1e6:.2f} M",
                     f"{mem:.2f}" if result["on_gpu"] else "–"))
    table = md_table(["model", "task", "probe contexts / s", "forwarded / s", "contexts per probe",
                      "forward TFLOP/s", "of fp32 matmul", "fine-tune step (ms)", "params", "peak GiB"],
                     rows, align="llrrrrrrrr")
    where = (f"**On one GPU: {result['device']}**" if result["on_gpu"] else
             "**No GPU was present**: this run used the CPU at a small size (the figures show the script "
             "works, not GPU speed; on a CUDA machine with tabicl and tabpfn installed, `python3 "
             "benchmarks/gpu.py --write-json gpu.json --no-write` there and `python3 benchmarks/gpu.py --from-json "
             f"gpu.json` here record the GPU figures); {result['device']}")
    v = ", ".join(f"{k} {val}" for k, val in result["versions"].items())
    return "\n".join([
        f"{where}; float32 matmul rate of the device (TF32 off) {peak / 1e12:.2f} TFLOP/s; {v}.",
        "",
        f"Tasks prepared by Stage I with Q={result['q']} (2Q queries) and context {result['context']}; default "
        f"48-manipulation suite; probe = `probes.scoring.score` as a probe actor runs it (invariance shortcut on, "
        f"median of {result['reps']}); fine-tune step = one `Finetuner.step` on C' with the Q member queries "
        f"(forward, backward, clip, AdamW), median of {result['steps']} after 2 warm-up steps. Forward TFLOP/s = "
        "matrix FLOPs of a `score` call (`FlopCounterMode`) / time inside the forward.",
        "",
        table,
    ])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    p.add_argument("--tasks", nargs="+", default=["breast_cancer", "digits"])
    p.add_argument("--q", type=int, default=50)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads when on the CPU")
    p.add_argument("--write-json", help="save the raw figures here")
    p.add_argument("--from-json", help="render a saved result instead of measuring")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
    else:
        result = measure(args)
        if args.write_json:
            Path(args.write_json).write_text(json.dumps(result, indent=2, default=float))
    publish(SECTION, render(result), args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
