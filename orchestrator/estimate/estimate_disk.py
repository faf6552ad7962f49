"""Disk, the fourth step of ``iclmem estimate`` (``orchestrator/estimate/estimate.py``): the bytes a sweep writes, where, at its
peak and at its end, under its ``training.keep_checkpoints`` (:class:`iclmem.vocab.KeepCheckpoints`).

Measured per (model, Q, task) unit (``orchestrator.estimate.estimate_measure.checkpoint_sizes``): a checkpoint's weights,
its resume state, its manifest with the ground-truth log, one probe job's stored result, one Stage I preparation.
Counted from the grid (``orchestrator.estimate.estimate_work``): trials (references included), checkpoints, probe jobs,
controls, preparations, epochs. The files whose size is Tune's, W&B's or the report's, not the model's, are sized
by the constants below, each fitted on the quickstart's folder (digits, 8 trials of 30 epochs, 36 checkpoint rows)
and checked on sweeps of other shapes (tests/test_estimate_disk.py, benchmarks/scale.py).

Where: Tune's storage (``storage_path``; the run folder's ``tune/`` by default) holds the checkpoints and Tune's
per-trial files; the run folder holds the rest. Peak: while trials run, each running trial's latest checkpoint
keeps its resume state (two of them while the next is written), and under ``last``/``none`` a checkpoint keeps its weights until its probe is stored
(a backlog of at most the trial slots' checkpoints, assumed)."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from iclmem.vocab import KeepCheckpoints

# Tune's files per trial (params, the trial folder) and per reported epoch (result.json, progress.csv, the
# TensorBoard events file): 82.5 KB over 30 reports in the quickstart's trial folders
TUNE_TRIAL_BYTES = 2_000
TUNE_REPORT_BYTES = 2_750
# Tune's experiment state (experiment_state-*.json): 320 KB for 8 trials, every trial's config and last result
TUNE_STATE_BYTES_PER_TRIAL = 40_000
# W&B offline, per run: 82 KB for a run without epochs (a control), about 3 KB per logged epoch and 31 KB per probed
# checkpoint (fitted on the quickstart's 30-epoch trials with 4 checkpoints, 300 KB, and the scale rehearsal's 2-epoch
# trials with 2, 150 KB); the summary run and its export about 1 MB plus about 5 KB per checkpoint row it tabulates
# (6.8 MB for 1,152 rows)
WANDB_RUN_BYTES = 82_000
WANDB_EPOCH_BYTES = 3_150
WANDB_CHECKPOINT_BYTES = 30_800
WANDB_SUMMARY_BYTES = 1_000_000
WANDB_SUMMARY_ROW_BYTES = 5_000
# the results tables, ROC files, risk tables, claim ledger, figures and HTML page beside them: about 0.8 MB and 3.7 KB
# per checkpoint row (fitted on the scale rehearsal's folders of 72 to 1,152 rows: 1.19 to 5.21 MB; 0.69 MB for a
# 6-row sweep, 1.12 MB for the quickstart's 36)
TABLE_BYTES = 800_000
TABLE_ROW_BYTES = 3_700
# the base model's score tables cached per preparation (reference/): about 12 KB and 74 bytes per context scored
# (2Q x the suite): 260 KB for the quickstart's, 21 KB for a 3-manipulation suite at 2Q = 30
REFERENCE_BYTES = 12_000
REFERENCE_CONTEXT_BYTES = 74


@dataclass(frozen=True)
class DiskPrediction:
    """Bytes a sweep writes: on Tune's storage and in the run folder, at the end and at the peak."""

    policy: str
    storage_final: int  # Tune's storage once the sweep ended: checkpoints (what the policy keeps) and Tune's files
    storage_peak: int  # and while trials run
    run_folder: int  # the run folder besides Tune's storage: probe results, Stage I, references, W&B, tables, report
    checkpoints_all: int  # what every checkpoint would hold under ``all`` (for the console: what the policy saves)
    storage_path: str = ""  # where Tune's storage is (empty: the run folder's tune/)
    wandb: bool = True  # whether W&B's offline files are counted (the sweep's W&B mode is not disabled)

    @property
    def final_bytes(self) -> int:
        return self.storage_final + self.run_folder

    @property
    def peak_bytes(self) -> int:
        return self.storage_peak + self.run_folder

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "final_bytes": self.final_bytes, "peak_bytes": self.peak_bytes}


def _per_run(work: Any, costs: dict[Any, Any], field: str) -> float:
    """A run's mean of a per-unit size over its tasks' units, averaged over the grid's runs (one model per run)."""
    compositions = work.compositions or {((k,), False): n for k, n in work.runs_by.items()}
    total = 0.0
    for (keys, _dp), n in compositions.items():
        total += n * statistics.mean(float(getattr(costs[k], field)) for k in keys)
    runs = sum(int(n) for n in compositions.values())
    return total / max(runs, 1)


def predict_disk(work: Any, costs: dict[Any, Any], policy: KeepCheckpoints | str, workers: int,
                 wandb: bool = True, storage_path: str = "") -> DiskPrediction:
    """The bytes of a counted grid (``work``) with measured unit sizes (``costs``: CostKey -> UnitCosts)."""
    policy = KeepCheckpoints(policy)
    runs, per_run = work.runs, len(work.schedule)
    checkpoints = runs * per_run
    weights, resume = _per_run(work, costs, "weights_bytes"), _per_run(work, costs, "resume_bytes")
    meta = _per_run(work, costs, "checkpoint_meta_bytes")
    kept_weights = {KeepCheckpoints.ALL: checkpoints, KeepCheckpoints.WEIGHTS: checkpoints,
                    KeepCheckpoints.LAST: runs, KeepCheckpoints.NONE: 0}[policy]
    kept_resume = checkpoints if policy == KeepCheckpoints.ALL else 0
    tune_files = runs * (TUNE_TRIAL_BYTES + work.epochs * TUNE_REPORT_BYTES + TUNE_STATE_BYTES_PER_TRIAL)
    storage_final = int(kept_weights * weights + kept_resume * resume + checkpoints * meta + tune_files)
    slots = work.trial_slots(workers)
    in_flight = 0.0
    if policy != KeepCheckpoints.ALL:  # each running trial's latest keeps its resume state, and while the next
        in_flight += 2 * slots * resume  # checkpoint is written the one before it still holds its own
    if policy in (KeepCheckpoints.LAST, KeepCheckpoints.NONE):  # and its checkpoints their weights until probed
        in_flight += slots * min(per_run, 2) * weights
    jobs = {k: n for k, n in work.checkpoint_jobs.items()}
    controls = dict(work.controls)
    results = sum((jobs.get(k, 0) + controls.get(k, 0)) * costs[k].result_bytes for k in costs if k in jobs)
    rows = sum(jobs.values()) + sum(controls.values())
    mean_prepared = statistics.mean(c.prepared_bytes for c in costs.values()) if costs else 0
    prepared = work.prepared_tasks * mean_prepared
    mean_q = sum(k.q * n for k, n in jobs.items()) / max(sum(jobs.values()), 1)
    references = work.prepared_tasks * (REFERENCE_BYTES + REFERENCE_CONTEXT_BYTES * 2 * mean_q * work.suite)
    tables = TABLE_BYTES + rows * TABLE_ROW_BYTES
    wandb_bytes = ((runs + sum(controls.values())) * WANDB_RUN_BYTES + runs * work.epochs * WANDB_EPOCH_BYTES
                   + sum(jobs.values()) * WANDB_CHECKPOINT_BYTES + WANDB_SUMMARY_BYTES
                   + rows * WANDB_SUMMARY_ROW_BYTES) if wandb else 0
    run_folder = int(results + prepared + references + tables + wandb_bytes)
    return DiskPrediction(policy=str(policy), storage_final=storage_final, storage_peak=int(storage_final + in_flight),
                          run_folder=run_folder, checkpoints_all=int(checkpoints * (weights + resume)),
                          storage_path=storage_path, wandb=wandb)


def free_bytes(path: str | Path) -> int | None:
    """Free bytes where ``path`` would be written (its nearest existing ancestor); None for a bucket URI."""
    import shutil

    from iclmem.runfolder import existing_ancestor

    if "://" in str(path):
        return None
    return shutil.disk_usage(existing_ancestor(Path(path))).free


def room_problems(prediction: DiskPrediction, run_dir: Path, storage: str) -> list[str]:
    """What does not fit: one line per place whose free space is below the bytes predicted there at the peak
    (Tune's storage and the run folder together when they share a disk), naming the setting to change."""
    import os

    from iclmem.runfolder import existing_ancestor

    def device(path: str | Path) -> int | None:
        return None if "://" in str(path) else os.stat(existing_ancestor(Path(path))).st_dev

    places: dict[int | None, tuple[str, int]] = {}
    run_device, storage_device = device(run_dir), device(storage)
    if storage_device is not None and storage_device == run_device:
        places[run_device] = (str(run_dir), prediction.peak_bytes)
    else:
        places[run_device] = (str(run_dir), prediction.run_folder)
        if storage_device is not None:
            places[storage_device] = (storage, prediction.storage_peak)
    problems = []
    for _dev, (where, need) in places.items():
        free = free_bytes(where)
        if free is not None and need > free:
            cheaper = ("" if prediction.policy in (KeepCheckpoints.LAST, KeepCheckpoints.NONE) else
                       "; training.keep_checkpoints: last keeps one checkpoint's weights per run")
            problems.append(f"{where}: the sweep is predicted to write {_gb(need)} there at its peak, and "
                            f"{_gb(free)} are free (training.keep_checkpoints: {prediction.policy}{cheaper}; or set "
                            "storage_path / --out to a disk with room)")
    return problems


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def sizes_only(key: Any, **sizes: int) -> Any:
    """A :class:`orchestrator.estimate.estimate_measure.UnitCosts` that holds only sizes (every time 0): what the disk
    prediction reads, where nothing was timed."""
    from orchestrator.estimate.estimate_measure import UnitCosts

    return UnitCosts(model=key.model, q=key.q, device="cpu", task=key.task, prepare_s=0.0, epoch_s=0.0, save_s=0.0,
                     plan_s=0.0, contexts=0, forwards_saved=0.0, score_per_context_s=0.0, rest_s=0.0, **sizes)


def predict_disk_from_folder(run_dir: Path, workers: int = 2) -> DiskPrediction:
    """The prediction for a finished run folder's own sweep (``sweep.json``), with unit sizes read from what it
    wrote rather than measured: for the scale rehearsal, which compares the prediction with the folder's bytes.
    Sizes: the first checkpoint's files, the first probe result, the first preparation."""
    from iclmem.runfolder import PROBES_DIR, TUNE_DIR
    from orchestrator.estimate.estimate_work import count_work
    from orchestrator.runfolder.run_folder import RunFolder
    from trainables.finetune import META_FILE, MODEL_FILE, REMOVED_KEY, STATE_FILE
    from trainables.upstream import UPSTREAM_STATE_FILE

    sweep = RunFolder(run_dir).sweep
    work = count_work(sweep)
    meta = next(Path(run_dir, TUNE_DIR).rglob(META_FILE))
    manifest = json.loads(meta.read_text())
    records = {**manifest.get(REMOVED_KEY, {}), **manifest["files"]}  # a removed file's record stays in the manifest
    resume = records.get(STATE_FILE) or records.get(UPSTREAM_STATE_FILE) or {}
    sizes = {"weights_bytes": int(records[MODEL_FILE]["bytes"]), "resume_bytes": int(resume.get("bytes", 0)),
             "checkpoint_meta_bytes": sum(p.stat().st_size for p in meta.parent.glob("*.json"))}
    first = next(Path(run_dir, PROBES_DIR).glob("*/e0001.json"))
    sizes["result_bytes"] = sum(p.stat().st_size for p in first.parent.glob("e0001.*"))
    prepared = sorted(Path(run_dir, "prepared").glob("*.npz"))
    sizes["prepared_bytes"] = prepared[0].stat().st_size + 2_500 if prepared else 0
    costs = {k: sizes_only(k, **sizes) for k in work.runs_by}
    return predict_disk(work, costs, sweep.training.keep_checkpoints, workers,
                        wandb=str(sweep.wandb.mode) != "disabled")


# Without measuring (``iclmem validate``, the check before a run): a probe job's stored result is about 40 KB, 300
# bytes per query row and per manipulation 1 KB and 10 bytes per query row (fitted on the quickstart's results, 118 KB
# at 2Q = 40 and 165 KB at 2Q = 100 with 48 manipulations; 59-64 KB with 2 or 3); the resume state is AdamW's two
# moments per weight (recipe iclmem) or the package's own checkpoint (the weights and both moments: recipe upstream),
# and the RNG state beside them
RESULT_FIXED_BYTES = 40_000
RESULT_QUERY_ROW_BYTES = 300
RESULT_MANIPULATION_BYTES = 1_000
RESULT_MANIPULATION_ROW_BYTES = 10
RNG_STATE_BYTES = 5_200
MANIFEST_BYTES = 1_300


def size_only_costs(prepared: Any) -> dict[Any, Any]:
    """Unit sizes of a prepared sweep (``orchestrator.runfolder.prepare.PreparedSweep``) without measuring a fine-tune: the
    weights' bytes from each model's tensors, the resume state from them, the ground-truth log and the
    preparation from the prepared tasks, a probe result from Q (what ``iclmem estimate`` measures instead)."""
    import numpy as np

    from orchestrator.estimate.estimate_work import count_work
    from trainables.data import ground_truth_log
    from trainables.models import build_model

    sweep = prepared.sweep
    work = count_work(sweep)
    upstream = {m.name: str(m.recipe) == "upstream" for m in sweep.models}
    options = {m.name: dict(m.options) for m in sweep.models}
    weights: dict[str, int] = {}
    for name, opts in options.items():
        module = build_model(name, **opts).module
        weights[name] = sum(t.numel() * t.element_size() for t in module.state_dict().values()) + 120 * len(
            module.state_dict())
    by_task: dict[tuple[str, int], Any] = {}
    for task in prepared.tasks.values():
        by_task.setdefault((task.name, len(task.member_idx)), task)
    costs = {}
    for key in work.runs_by:
        task = by_task.get((key.task, key.q)) or next(iter(prepared.tasks.values()))
        truth = len(json.dumps({"run_id": "r" * 40, "tasks": [ground_truth_log(task, sweep.probe.null_splits)]},
                               default=str).encode())
        # the preparation's arrays as save_prepared writes them (an uncompressed .npz: their bytes and a header each)
        arrays = sum(np.asarray(a).nbytes + 200 for a in (task.features, task.labels, task.original_labels,
                                                           task.row_ids, task.member_idx, task.nonmember_idx,
                                                           task.context_idx))
        w = weights[key.model]
        costs[key] = sizes_only(key, weights_bytes=w, resume_bytes=(3 if upstream[key.model] else 2) * w + RNG_STATE_BYTES,
                               checkpoint_meta_bytes=MANIFEST_BYTES + truth,
                               result_bytes=int(RESULT_FIXED_BYTES + RESULT_QUERY_ROW_BYTES * 2 * key.q
                                                + work.suite * (RESULT_MANIPULATION_BYTES
                                                                + RESULT_MANIPULATION_ROW_BYTES * 2 * key.q)),
                               prepared_bytes=arrays + 2_500)
    return costs


def disk_line(prediction: DiskPrediction) -> str:
    """One console line: the bytes at the end and at the peak, and what the policy saves."""
    return (f"disk: about {_gb(prediction.final_bytes)} at the end ({_gb(prediction.peak_bytes)} at the peak) under "
            f"training.keep_checkpoints: {prediction.policy}; every checkpoint kept whole (all) would hold "
            f"{_gb(prediction.checkpoints_all)}")


def check_room(prepared: Any, run_dir: Path, storage: str, workers: int, already: int = 0) -> tuple[str, list[str]]:
    """(the console's disk line, what does not fit) for a prepared sweep about to run: the size-only prediction
    (:func:`size_only_costs`) against the free space where it writes. ``already``: bytes of this sweep already on
    disk (a resumed sweep needs only the rest)."""
    from dataclasses import replace

    from orchestrator.estimate.estimate_work import count_work

    sweep = prepared.sweep
    prediction = predict_disk(count_work(sweep), size_only_costs(prepared), sweep.training.keep_checkpoints,
                              max(workers, 1), wandb=str(sweep.wandb.mode) != "disabled", storage_path=storage)
    if already:
        prediction = replace(prediction, run_folder=max(prediction.run_folder - already, 0))
    return disk_line(prediction), room_problems(prediction, run_dir, storage)
