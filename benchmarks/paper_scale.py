"""The work ``configs/paper.yaml`` implies, its unit costs on this machine, and the grid's wall time.

    python3 benchmarks/paper_scale.py [--quick] [--config configs/paper.yaml] [--task digits]
                                      [--workers 1 8 32] [--no-write]

1. **Count** with the config's own grid (``load_sweep`` + ``expand_grid``): runs, epochs and checkpoint
   schedule; fine-tuning steps (single_fixed: one AdamW step per epoch) and the two ICL evaluation
   forwards per epoch the trainable reports; probe contexts = checkpoints x 2Q x |suite| per run, plus the
   base-model control probed like a checkpoint once per (task, Q, label mode, seed); reference contexts
   computed once per (task, Q, label mode, seed, suite, base model) and the ones sharing saves:
   (runs sharing a reference - 1) x 2Q x |suite| per reference.
2. **Measure** unit costs on this machine with the shipped pfn-mini (1 torch thread, as a trial and a probe
   actor run): the CARTE tables of paper.yaml are not present here, so on a built-in task, ``digits`` by
   default (10 classes, like the 10 quantile bins of the paper's regression targets; 16 features after PCA,
   like theirs). Per Q of the grid: one fine-tuning epoch (``Finetuner.run_epoch``: step + evaluation),
   one checkpoint save, ``ProbePlan.build``, the scoring cost per context (``score`` at Q=50, whose
   context shapes and so per-context cost do not depend on Q), and the rest of a checkpoint's probe
   (``probe_checkpoint`` with its two score tables stubbed: ICL predictions, 1000-resample bootstrap
   intervals, per-manipulation AUCs, ROC).
3. **Estimate** the grid's compute (CPU-seconds on this machine) and its wall time on N workers (one core
   each, perfect packing; never below the longest single run): max(total / N, longest run).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, md_table, median, set_threads, publish  # noqa: E402

SECTION = "Paper scale: the work of configs/paper.yaml and its wall time"


# ----------------------------------------------------------------------------------------- counting
def count(config: Path) -> dict:
    from orchestrator.config import expand_grid, load_sweep
    from probes.actors import suite_for
    from trainables.finetune import FinetuneSpec

    sweep = load_sweep(config)
    trials = expand_grid(sweep)
    t = sweep.training
    suite = len(suite_for(sweep.probe.suite))
    schedule = FinetuneSpec(epochs=t.epochs, checkpoint_epochs=tuple(t.checkpoint_epochs),
                            every_epoch=t.every_epoch).schedule()
    ckpts = len(schedule)
    steps_per_epoch = {"single_fixed": 1, "multi_random": 1}  # per task; multi_fixed: one per task
    by_q = Counter(tr.q for tr in trials)
    refs = Counter((tr.task, tr.model, tr.q, tr.label_mode, tr.seed) for tr in trials)
    ref_q = Counter(key[2] for key in refs)
    controls = ref_q if sweep.probe.base_as_checkpoint else Counter()
    n_tasks = len(sweep.tasks)
    steps = sum(t.epochs * (n_tasks if tr.regime == "multi_fixed" else steps_per_epoch.get(tr.regime, 1)) for tr in trials)
    probe_ctx = {q: n * ckpts * 2 * q * suite for q, n in by_q.items()}
    control_ctx = {q: n * 2 * q * suite for q, n in controls.items()}
    ref_ctx = {q: n * 2 * q * suite for q, n in ref_q.items()}
    sharing = Counter(refs.values())  # runs per reference -> how many references
    saved = sum((runs - 1) * 2 * key[2] * suite for key, runs in refs.items())
    return {
        "sweep": sweep, "trials": trials, "runs": len(trials), "epochs": t.epochs, "schedule": schedule,
        "checkpoints": ckpts, "suite": suite, "by_q": dict(sorted(by_q.items())), "steps": steps,
        "eval_forwards": 2 * t.epochs * len(trials), "probe_ctx": probe_ctx, "control_ctx": control_ctx,
        "ref_ctx": ref_ctx, "references": len(refs), "ref_q": dict(sorted(ref_q.items())),
        "controls": dict(sorted(controls.items())), "sharing": dict(sharing), "saved_ctx": saved,
        "tasks": [tk.name for tk in sweep.tasks], "grid": sweep.grid.model_dump(),
        "ckpt_jobs": {q: n * ckpts for q, n in by_q.items()},
    }


# ----------------------------------------------------------------------------------------- measuring
def fake_table(plan, rng: np.random.Generator):
    """A score table of the plan's shape with random scores (the stubbed ``score``)."""
    import pandas as pd

    q = plan.queries
    qi = np.fromiter((p.query_index for p in plan.planned), dtype=np.int64, count=len(plan.planned))
    mi = np.fromiter((p.manipulation_index for p in plan.planned), dtype=np.int64, count=len(plan.planned))
    loss = rng.gamma(2.0, 0.5, size=len(qi)).astype(np.float32)
    return pd.DataFrame({
        "query_id": q.query_ids[qi], "member": q.member[qi],
        "manipulation": np.array([m.name for m in plan.suite], dtype=object)[mi],
        "category": np.array([m.category for m in plan.suite], dtype=object)[mi],
        "loss": loss, "entropy": rng.uniform(0, np.log(q.n_classes), size=len(qi)).astype(np.float32),
        "confidence": np.exp(-loss).astype(np.float32),
    })


def measure(task_name: str, q: int, context: int, sweep, model, epochs: int, score_rounds: int, digest: str,
            cache: Path) -> dict:
    import probes.probe as probe_mod
    from probes.manipulations import default_suite
    from probes.outcomes import OutcomeThresholds
    from probes.probe import ProbeSettings
    from probes.scoring import ProbePlan, ProbeQueries, score
    from trainables.data import TaskSource, prepare_task
    from trainables.finetune import FinetuneSpec, Finetuner

    out: dict = {"q": q}
    task = prepare_task(TaskSource(task_name, "builtin"), seed=0, q=q, context_size=context)
    out["classes"], out["features"], out["context"] = task.n_classes, task.n_features, len(task.context_idx)

    # Fine-tuning: epochs as the trainable runs them (step + member/non-member evaluation), and a save.
    spec = FinetuneSpec(model="pfn-mini", lr=1e-4, epochs=epochs + 1, grad_clip=sweep.training.grad_clip,
                        weight_decay=sweep.training.weight_decay)
    ft = Finetuner(spec, [task])
    ft.run_epoch()  # warm-up
    epoch_s = []
    for _ in range(epochs):
        start = time.perf_counter()
        ft.run_epoch()
        epoch_s.append(time.perf_counter() - start)
    out["epoch_s"] = median(epoch_s)
    save_s = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(3):
            start = time.perf_counter()
            ft.save(Path(tmp) / f"c{i}", {"epoch": ft.epoch})
            save_s.append(time.perf_counter() - start)
    out["save_s"] = median(save_s)

    # Probe plan: built once per task per probe actor.
    queries = ProbeQueries.from_task(task)
    start = time.perf_counter()
    plan = ProbePlan.build(queries, default_suite(), task.seed, compress_rows=model.supports_context_weights)
    out["plan_s"] = time.perf_counter() - start
    out["contexts"] = len(plan.planned)

    # Scoring cost per context (real forward passes).
    if score_rounds:
        runs = []
        for _ in range(score_rounds):
            start = time.perf_counter()
            score(model, plan)
            runs.append(time.perf_counter() - start)
        out["score_per_ctx"] = median(runs) / len(plan.planned)

    # The rest of a checkpoint's probe, with both score tables stubbed (random scores of the right shape).
    rng = np.random.default_rng(0)
    finetuned, reference = fake_table(plan, rng), fake_table(plan, rng)
    settings = ProbeSettings(n_resamples=sweep.probe.bootstrap,
                             thresholds=OutcomeThresholds.from_dict(sweep.outcome.model_dump()))
    saved_score, saved_ref = probe_mod.score, probe_mod.reference_scores
    probe_mod.score = lambda _model, _plan: finetuned
    probe_mod.reference_scores = lambda *_a, **_k: reference
    try:
        probe_mod.base_icl(cache, task, digest, model)  # cached once per task, as in a sweep
        rest = []
        for epoch in (1, 2):
            start = time.perf_counter()
            probe_mod.probe_checkpoint(ft.model, task, plan, cache, digest, model, settings, {"run_id": "bench"}, epoch)
            rest.append(time.perf_counter() - start)
        out["rest_s"] = median(rest)
    finally:
        probe_mod.score, probe_mod.reference_scores = saved_score, saved_ref
    print(f"Q={q}: epoch {out['epoch_s'] * 1e3:.1f} ms, save {out['save_s'] * 1e3:.1f} ms, plan {out['plan_s']:.2f} s "
          f"for {out['contexts']} contexts"
          + (f", score {out['score_per_ctx'] * 1e3:.3f} ms/context" if "score_per_ctx" in out else "")
          + f", rest of probe {out['rest_s']:.2f} s", flush=True)
    return out


# ----------------------------------------------------------------------------------------- estimate
def human(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer epochs and one scoring round (< 1 min)")
    p.add_argument("--config", default=str(REPO / "configs" / "paper.yaml"))
    p.add_argument("--task", default="digits", help="built-in task the costs are measured on")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--epochs", type=int, default=12, help="fine-tuning epochs timed per Q")
    p.add_argument("--score-rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.score_rounds = 4, 1
    set_threads(args.threads)
    import warnings

    warnings.filterwarnings("ignore", message=".*the estimate is coarse")  # TPR@1% on 50 non-members: expected

    import torch

    from probes.calibration import model_digest
    from trainables.models import build_model

    c = count(Path(args.config))
    sweep = c["sweep"]
    print(f"{c['runs']} runs x {c['epochs']} epochs, checkpoints {c['schedule']}, Q {c['by_q']}, "
          f"{c['references']} references", flush=True)
    model = build_model("pfn-mini")
    digest = model_digest(model)
    qs = sorted(c["by_q"])
    costs = {}
    with tempfile.TemporaryDirectory(prefix="iclmem-paper-scale-") as tmp:
        for i, q in enumerate(qs):
            # Per-context scoring cost is measured at the smallest Q (context shapes do not depend on Q).
            costs[q] = measure(args.task, q, sweep.data.context_size, sweep, model, args.epochs,
                               args.score_rounds if i == 0 else 0, digest, Path(tmp))
    per_ctx = costs[qs[0]]["score_per_ctx"]

    # Compute, in CPU-seconds of this machine.
    ft = {q: c["by_q"][q] * (c["epochs"] * costs[q]["epoch_s"] + c["checkpoints"] * costs[q]["save_s"]) for q in qs}
    probe_score = {q: (c["probe_ctx"][q] + c["control_ctx"].get(q, 0)) * per_ctx for q in qs}
    probe_rest = {q: (c["ckpt_jobs"][q] + c["controls"].get(q, 0)) * costs[q]["rest_s"] for q in qs}
    ref = {q: c["ref_ctx"][q] * per_ctx for q in qs}
    jobs_per_task = {q: c["ckpt_jobs"][q] // max(c["ref_q"][q], 1) + (1 if c["controls"] else 0) for q in qs}

    def plan_builds(n: int) -> float:  # one build per (prepared task, worker that probes it)
        return sum(c["ref_q"][q] * min(n, jobs_per_task[q]) * costs[q]["plan_s"] for q in qs)

    fixed = sum(ft.values()) + sum(probe_score.values()) + sum(probe_rest.values()) + sum(ref.values())
    # The longest chain: one run's epochs and saves, then the probe of its last checkpoint.
    longest = max(c["epochs"] * costs[q]["epoch_s"] + c["checkpoints"] * costs[q]["save_s"]
                  + costs[q]["contexts"] * per_ctx + costs[q]["rest_s"] for q in qs)
    saved_s = c["saved_ctx"] * per_ctx

    # ---- report
    suite, ck = c["suite"], c["checkpoints"]
    count_rows = [
        ("fine-tuning runs", f"{c['runs']:,}", f"{len(c['tasks'])} tasks x {len(c['grid']['lr'])} lr x "
         f"{len(c['grid']['q'])} Q x {len(c['grid']['label_mode'])} label modes x {len(c['grid']['seed'])} seed(s) x "
         f"{len(c['grid']['regime'])} regime(s)"),
        ("fine-tuning steps", f"{c['steps']:,}", f"runs x {c['epochs']} epochs (single_fixed: 1 AdamW step per epoch)"),
        ("ICL evaluation forwards", f"{c['eval_forwards']:,}", "runs x epochs x 2 (members, non-members; reported every epoch)"),
        ("checkpoints probed", f"{sum(c['ckpt_jobs'].values()):,}", f"runs x {ck} (epochs {', '.join(map(str, c['schedule']))})"),
        ("probe contexts (forwards of one context)", f"{sum(c['probe_ctx'].values()):,}",
         " + ".join(f"{c['by_q'][q]} runs x {ck} x 2·{q} x {suite}" for q in qs)),
        ("base-model controls (probed like a checkpoint)", f"{sum(c['control_ctx'].values()):,}",
         f"{sum(c['controls'].values())} controls x 2Q x {suite}"),
        ("reference contexts computed (once per reference)", f"{sum(c['ref_ctx'].values()):,}",
         f"{c['references']} references (task x Q x label mode x seed) x 2Q x {suite}"),
        ("reference contexts saved by sharing", f"{c['saved_ctx']:,}",
         "; ".join(f"{n} references shared by {k} runs each" for k, n in sorted(c["sharing"].items()))
         + f": Σ (runs − 1) x 2Q x {suite}"),
    ]
    cost_rows = []
    for q in qs:
        m = costs[q]
        cost_rows.append((f"Q={q}", f"{m['epoch_s'] * 1e3:.1f}", f"{m['save_s'] * 1e3:.1f}", f"{m['contexts']:,}",
                          f"{m['plan_s']:.2f}", f"{per_ctx * 1e3:.3f}" + (" (measured)" if q == qs[0] else " (from Q=%d)" % qs[0]),
                          f"{m['contexts'] * per_ctx:.1f}", f"{m['rest_s']:.2f}"))
    est_rows = [
        ("fine-tuning (epochs + checkpoint saves)", human(sum(ft.values())), f"{sum(ft.values()) / 3600:,.1f}"),
        ("probe scoring (checkpoints + controls)", human(sum(probe_score.values())), f"{sum(probe_score.values()) / 3600:,.1f}"),
        ("rest of probes (bootstrap, AUCs, ICL predictions)", human(sum(probe_rest.values())), f"{sum(probe_rest.values()) / 3600:,.1f}"),
        ("reference scoring (once per reference)", human(sum(ref.values())), f"{sum(ref.values()) / 3600:,.1f}"),
        ("plan building (1 worker)", human(plan_builds(1)), f"{plan_builds(1) / 3600:,.2f}"),
        ("**total (1 worker)**", f"**{human(fixed + plan_builds(1))}**", f"{(fixed + plan_builds(1)) / 3600:,.1f}"),
        ("saved by sharing the reference", human(saved_s), f"{saved_s / 3600:,.1f}"),
    ]
    wall_rows = []
    for n in args.workers:
        total_n = fixed + plan_builds(n)
        wall = max(total_n / n, longest)
        wall_rows.append((f"N = {n}", human(wall), f"{total_n / 3600:,.1f}",
                          "longest run" if wall == longest else "total / N"))
    share = {k: v / (fixed + plan_builds(1)) for k, v in (("ft", sum(ft.values())), ("score", sum(probe_score.values())),
                                                          ("rest", sum(probe_rest.values())), ("ref", sum(ref.values())))}
    text = "\n".join([
        f"**Headline:** `configs/paper.yaml` = {c['runs']} runs, {c['steps']:,} fine-tuning steps, "
        f"{sum(c['probe_ctx'].values()) + sum(c['control_ctx'].values()):,} probe contexts and "
        f"{sum(c['ref_ctx'].values()):,} reference contexts (sharing saves {c['saved_ctx']:,}); with pfn-mini on this "
        f"machine ≈ **{human(fixed + plan_builds(1))}** of compute on one core → "
        + ", ".join(f"{r[0].replace('N = ', 'N=')}: **{r[1]}**" for r in wall_rows)
        + f". Shares: fine-tuning {share['ft']:.0%}, probe scoring {share['score']:.0%}, rest of probes "
        f"{share['rest']:.0%}, reference {share['ref']:.0%}.",
        "",
        f"Grid from `{Path(args.config).relative_to(REPO) if Path(args.config).is_relative_to(REPO) else args.config}` "
        f"(tasks: {', '.join(c['tasks'])}; not present on this machine, so only counted). Costs measured with the "
        f"**shipped pfn-mini** (570k parameters; the paper audits ConTextTab, which `benchmarks/RESULTS.md` "
        f"\"Adapter benchmark\" times at ~2,000x pfn-mini's forward on CPU: this estimate is for pfn-mini only) on "
        f"the built-in `{args.task}` task ({costs[qs[0]]['classes']} classes, {costs[qs[0]]['features']} features, "
        f"context {costs[qs[0]]['context']} rows), torch {torch.__version__}, {args.threads} thread(s).",
        "",
        "### Work implied by the grid",
        "",
        md_table(["quantity", "count", "how"], count_rows, align="lrl"),
        "",
        "### Unit costs on this machine",
        "",
        md_table(["", "epoch (ms): step + eval", "checkpoint save (ms)", "contexts per probe (2Q x suite)",
                  "plan build (s)", "score ms / context", "score s / checkpoint", "rest of probe (s)"],
                 cost_rows),
        "",
        "### Estimate",
        "",
        md_table(["compute", "1 worker", "CPU-hours"], est_rows),
        "",
        md_table(["workers", "wall time", "CPU-hours incl. plan builds", "bound by"], wall_rows),
        "",
        f"Model of the estimate: every unit of work runs on one core of this machine at the measured cost; N workers "
        f"pack it perfectly (fine-tuning and probing overlap, as the pipeline's checkpoint callback makes them), so "
        f"wall = max(total / N, longest chain = one run's training + the probe of its last checkpoint = {human(longest)}). Plan builds: once per (prepared task, worker "
        f"probing it), at most one per probe job. Not included: Ray/Tune start-up and per-report overhead (see "
        f"\"Fine-tuning overhead\"), Stage I preparation, aggregation and reports, data transfer between nodes. The "
        f"per-context scoring cost is measured at Q={qs[0]} and applied to every Q (a context's shape does not "
        f"depend on Q); the rest of a probe is measured at each Q with the score tables stubbed.",
    ])
    publish(SECTION, text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
