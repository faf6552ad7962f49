"""Fabricates a realistic, hand-checkable run directory for the reporting tests.

Main regime (single_fixed): 3 tasks x 4 learning rates x Q in {50, 512} = 24 runs, checkpoints at epochs
0, 1, 2, 5, 10. Every run has a planted peak outcome, peak epoch and peak AUC (``PLAN``); the expected
numbers the tests check are listed in ``EXPECTED``. Four multi_fixed (one run id shared by two tasks) and
four multi_random runs at Q=50 feed the regime comparison.

A canary string is planted wherever a careless reporter could leak a raw record: an extra ``raw_record``
column in every parquet, and a raw-record config field in ``provenance.json``.

Files are written by the writers a sweep uses: ``record_sweep`` (``sweep.json`` and ``provenance.json``),
``Provenance.write`` and ``write_parquet_atomic``. ``sweep.json`` records the single_fixed grid and the
checkpoint schedule (epochs 1, 2, 5, 10); the multi_fixed / multi_random rows are fabricated beside it for
the regime comparison. Options make the variants the report must describe: several label modes, a
manipulation that is a no-op for the model, runs with missing checkpoints or none, an interruption record.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import numpy as np
import pandas as pd

from iclmem.provenance import Provenance
from iclmem.runfolder import RESULTS_FILE

CANARY = "CANARY-raw-row-7f3a9c-DO-NOT-LEAK"
EPOCHS = (0, 1, 2, 5, 10)
TRAINED = (1, 2, 5, 10)
LRS = (1e-1, 1e-2, 1e-3, 1e-4)
TASKS = ("bin_task", "multi_task", "reg_task")

# (task, lr, q) -> (outcome at peak, peak epoch, peak AUC, memorization onset epoch)
PLAN: dict[tuple[str, float, int], tuple[str, int, float, int | None]] = {
    ("bin_task", 1e-1, 50): ("collapse", 1, 0.55, None),
    ("bin_task", 1e-2, 50): ("memorization", 5, 0.67, 2),
    ("bin_task", 1e-3, 50): ("memorization", 10, 0.64, 5),
    ("bin_task", 1e-4, 50): ("inversion", 2, 0.46, None),
    ("multi_task", 1e-1, 50): ("collapse", 1, 0.51, None),
    ("multi_task", 1e-2, 50): ("collapse", 1, 0.53, None),
    ("multi_task", 1e-3, 50): ("memorization", 10, 0.61, 10),
    ("multi_task", 1e-4, 50): ("no_signal", 2, 0.52, None),  # tie with epoch 5 -> earliest (2)
    ("reg_task", 1e-1, 50): ("collapse", 1, 0.50, None),
    ("reg_task", 1e-2, 50): ("inversion", 2, 0.45, None),
    ("reg_task", 1e-3, 50): ("overfitting", 2, 0.51, None),  # raw score flags it (raw_only)
    ("reg_task", 1e-4, 50): ("no_signal", 2, 0.53, None),
    ("bin_task", 1e-1, 512): ("collapse", 1, 0.52, None),
    ("bin_task", 1e-2, 512): ("memorization", 10, 0.58, 10),
    ("bin_task", 1e-3, 512): ("memorization", 2, 0.66, 2),  # peak from auc_entropy, not the auc column
    ("bin_task", 1e-4, 512): ("no_signal", 2, 0.51, None),
    ("multi_task", 1e-1, 512): ("collapse", 1, 0.50, None),
    ("multi_task", 1e-2, 512): ("inversion", 2, 0.47, None),
    ("multi_task", 1e-3, 512): ("overfitting", 2, 0.505, None),
    ("multi_task", 1e-4, 512): ("no_signal", 2, 0.515, None),
    ("reg_task", 1e-1, 512): ("collapse", 1, 0.50, None),
    ("reg_task", 1e-2, 512): ("no_signal", 2, 0.54, None),
    ("reg_task", 1e-3, 512): ("no_signal", 2, 0.525, None),
    ("reg_task", 1e-4, 512): ("overfitting", 2, 0.51, None),  # no ROC files for this run
}
CALIBRATED_ONLY_RUN = ("bin_task", 1e-3, 50)  # raw_outcome never memorization
RAW_ONLY_RUN = ("reg_task", 1e-3, 50)  # raw_outcome memorization at every trained epoch
ENTROPY_PEAK_RUN = ("bin_task", 1e-3, 512)
TIE_RUN = ("multi_task", 1e-4, 50)
NO_ROC_RUN = ("reg_task", 1e-4, 512)

REGIME_PLAN: dict[tuple[str, str, float], str] = {
    ("multi_fixed", "bin_task", 1e-3): "memorization",
    ("multi_fixed", "multi_task", 1e-3): "no_signal",
    ("multi_fixed", "bin_task", 1e-4): "no_signal",
    ("multi_fixed", "multi_task", 1e-4): "no_signal",
    ("multi_random", "bin_task", 1e-3): "inversion",
    ("multi_random", "multi_task", 1e-3): "no_signal",
    ("multi_random", "bin_task", 1e-4): "no_signal",
    ("multi_random", "multi_task", 1e-4): "no_signal",
}

MANIPULATIONS = {  # name -> (category, mean AUC over trained checkpoints)
    "combo2_random_skew_true_x2": ("combo2", 0.63),
    "skew_true_x2": ("skew_true", 0.60),
    "scale_uniform_x5": ("scale_uniform", 0.58),
    "position_first": ("position", 0.55),
    "base": ("base", 0.52),
    "skew_incorrect_k1_x2": ("skew_incorrect", 0.50),  # 0.99 at epoch 0: must be excluded
}

EXPECTED = {
    "counts_q50": {"collapse": 4, "memorization": 3, "inversion": 2, "overfitting": 1, "no_signal": 2},
    "counts_q512": {"collapse": 3, "memorization": 2, "inversion": 1, "overfitting": 2, "no_signal": 4},
    # detectable share by epoch (non-cumulative), 12 runs per Q at every epoch
    "detectable_q50": {0: 0, 1: 0, 2: 1, 5: 2, 10: 3},
    "detectable_q512": {0: 0, 1: 0, 2: 1, 5: 1, 10: 2},
    # calibration impact at checkpoint level, Q=50, trained epochs: 48 checkpoints
    # over the non-collapsed fine-tuned checkpoints: 12 runs x 4 epochs, less 4 collapsed runs x 4
    "calibration_q50": {"n": 32, "calibrated_flags": 6, "raw_flags": 8, "both": 4, "calibrated_only": 2,
                        "raw_only": 4},
    "calibration_q512": {"n": 36, "calibrated_flags": 4, "raw_flags": 4, "both": 4, "calibrated_only": 0,
                         "raw_only": 0},
    "ranking": list(MANIPULATIONS),
    "peak_vulnerability": {  # task -> (peak AUC, lr, q, epoch, n_memorization of 8)
        "bin_task": (0.67, 1e-2, 50, 5, 4),
        "multi_task": (0.61, 1e-3, 50, 10, 1),
        "reg_task": (0.54, 1e-2, 512, 2, 0),
    },
}

TASK_CHARS = {  # task -> n_rows, n_classes, majority_share, numeric_share, classification?
    "bin_task": (1200, 2, 0.5, 1.0, True),
    "multi_task": (3000, 5, 0.3, 0.6, True),
    "reg_task": (5000, 10, 0.1, 0.8, False),
}


def run_id(regime: str, task: str, lr: float, q: int, label_mode: str = "normal") -> str:
    mode = "" if label_mode == "normal" else f"_{label_mode}"
    if regime == "multi_fixed":  # one model fine-tuned on every task: one run id, one row per task
        return f"multi_fixed_lr{lr:g}_q{q}{mode}"
    return f"{regime}_{task}_lr{lr:g}_q{q}{mode}"


def _checkpoint_auc(epoch: int, peak_epoch: int, peak_auc: float) -> float:
    if epoch == 0:
        return 0.5
    return round(peak_auc - 0.02 * abs(TRAINED.index(epoch) - TRAINED.index(peak_epoch)), 6)


def _row(regime, task, lr, q, epoch, outcome, raw_outcome, auc, kinds=None, score_kind="loss",
         label_mode="normal") -> dict:
    kinds = kinds or {"loss": auc, "entropy": auc - 0.03, "confidence": auc - 0.05}
    mem = outcome == "memorization"
    return {
        "run_id": run_id(regime, task, lr, q, label_mode), "task": task, "model": "pfn-mini", "regime": regime,
        "lr": lr, "q": q, "label_mode": label_mode, "seed": 0, "epoch": epoch, "outcome": outcome,
        "n_members": q, "n_nonmembers": q,  # Stage I draws Q of each
        "score_kind": score_kind, "auc": kinds[score_kind], "auc_low": kinds[score_kind] - 0.05,
        "auc_high": kinds[score_kind] + 0.05, "tpr_at_1pct": 0.05 if mem else 0.01,
        "tpr_at_10pct": 0.25 if mem else 0.10, "loss_ratio": 7.0 if outcome == "collapse" else 1.1,
        "output_std": 0.001 if outcome == "collapse" else 0.1,
        "mu_gap": 0.005 if outcome == "overfitting" else 0.05,
        "sigma_gap": 0.005 if outcome == "overfitting" else 0.05,
        "raw_auc": auc + 0.1, "ref_auc": 0.55, "raw_outcome": raw_outcome, "config_hash": "cfg123",
        # the verdict's rule and both memorization flags, as every row the probe writes has them
        "rule": "selection_aware", "calibrated_memorization_flag": mem,
        "raw_memorization_flag": raw_outcome == "memorization", "fine_tuned": epoch > 0, "sanity_check": False,
        "git_commit": "abc123", "auc_loss": kinds["loss"], "auc_entropy": kinds["entropy"],
        "auc_confidence": kinds["confidence"],
        "raw_record": f"{CANARY} features=[3.1, 4.1] label=yes",  # must never reach a report
        # one null split per fine-tuned checkpoint, never flagged (the error-rate section has its input)
        "null_splits": 0 if epoch == 0 else 1,
        "null_evidence": json.dumps([] if epoch == 0 else [{
            "index": 0, "n_members": q, "n_nonmembers": q, "auc_loss": 0.5, "auc_entropy": 0.5,
            "auc_confidence": 0.5, **{f"outcome_{r}": "no_signal" for r in
                                      ("paper", "paper_strict", "selection_aware", "selection_aware_strict")}}]),
    }


def _roc(auc: float) -> pd.DataFrame:
    a = 1.0 / auc - 1.0  # tpr = fpr ** a has AUC 1 / (1 + a)
    fpr = np.concatenate([[0.0], np.logspace(-2.5, 0, 30)])
    return pd.DataFrame({"fpr": fpr, "tpr": fpr ** a})


def sweep_config(label_modes: tuple[str, ...] = ("normal",), outcome: dict | None = None):
    """The validated sweep config the synthetic single_fixed grid corresponds to."""
    from orchestrator.schema.config import parse_sweep

    return parse_sweep({
        "name": "synthetic", "tasks": [{"name": t} for t in TASKS],
        "grid": {"regime": ["single_fixed"], "lr": list(LRS), "q": [50, 512], "label_mode": list(label_modes)},
        "training": {"epochs": max(TRAINED), "checkpoint_epochs": list(TRAINED)},
        "outcome": {"rule": "paper", **(outcome or {})},
    })


def make_synthetic_run_dir(
    root: str | Path, *, with_optional: bool = True, label_modes: tuple[str, ...] = ("normal",),
    noop: tuple[str, ...] = (), drop_epochs: dict[str, tuple[int, ...]] | None = None,
    drop_runs: tuple[str, ...] = (), interrupted: str | None = None, outcome: dict | None = None,
) -> Path:
    """The run folder; the options make variants. ``label_modes``: the single_fixed plan again for every
    further label mode (same outcomes, own run ids). ``noop``: manipulations (category ``position``) whose
    AUC equals ``base``'s at every checkpoint. ``drop_epochs``: run id -> epochs whose rows (and ROC) are
    not stored; ``drop_runs``: run ids with no stored row at all. ``interrupted``: ``"run_state"`` records
    the interruption with the driver's own writer (``write_run_state``). ``outcome``: the config's outcome block."""
    from iclmem.atomic import write_parquet_atomic
    from orchestrator.report.folder_claims import record_sweep

    run_dir = Path(root)
    run_dir.mkdir(parents=True, exist_ok=True)
    drop_epochs = drop_epochs or {}
    outcome_block = outcome  # the name `outcome` is reused for each run's planted outcome below
    rows = []
    plan = [(mode, key, v) for mode in label_modes for key, v in PLAN.items()]
    for mode, (task, lr, q), (outcome_at_peak, peak, peak_auc, onset) in plan:
        key = (task, lr, q)
        outcome_ = outcome_at_peak
        for e in EPOCHS:
            auc = _checkpoint_auc(e, peak, peak_auc)
            if e == 0:
                out = "no_signal"
            elif outcome_ == "memorization":
                out = "memorization" if e >= onset else "no_signal"
            else:
                out = outcome_
            raw = out
            if key == CALIBRATED_ONLY_RUN:
                raw = "no_signal"
            if key == RAW_ONLY_RUN and e > 0:
                raw = "memorization"
            kinds = None
            if key == ENTROPY_PEAK_RUN and e == peak:
                kinds = {"loss": 0.58, "entropy": 0.66, "confidence": 0.55}
            if key == TIE_RUN and e == 5:
                auc = peak_auc
            rows.append(_row("single_fixed", task, lr, q, e, out, raw, auc, kinds, label_mode=mode))
    for (regime, task, lr), outcome in REGIME_PLAN.items():
        peak_auc = 0.60 if outcome == "memorization" else 0.52
        for e in EPOCHS:
            auc = _checkpoint_auc(e, 2, peak_auc)
            out = "no_signal" if e == 0 else outcome
            rows.append(_row(regime, task, lr, 50, e, out, out, auc))
    results = pd.DataFrame(rows)
    stored = ~results["run_id"].isin(drop_runs)
    for rid, epochs in drop_epochs.items():
        stored &= ~((results["run_id"] == rid) & results["epoch"].isin(epochs))
    results = results[stored].reset_index(drop=True)
    write_parquet_atomic(results, run_dir / RESULTS_FILE)
    if not with_optional:
        return run_dir
    record_sweep(run_dir, sweep_config(label_modes, outcome_block))  # sweep.json (+ provenance, replaced below)
    if interrupted == "run_state":  # what the sweep driver writes when Ctrl-C stops it
        from iclmem.runfolder import RunStatus, write_run_state

        write_run_state(run_dir, RunStatus.INTERRUPTED, incomplete_runs=list(drop_epochs))
    elif interrupted:
        raise ValueError(f"interrupted={interrupted!r}: only the driver's own record ('run_state') exists")

    split_rows = []
    for (task, (n_rows, n_classes, maj, num, is_cls)), mode in ((t, m) for t in TASK_CHARS.items() for m in label_modes):
        for q in (50, 512):
            tvd = (0.06 if (task == "multi_task" and q == 512) else 0.02) if is_cls else np.nan
            split_rows.append({
                "task": task, "label_mode": mode, "seed": 0, "q": q, "n_rows": n_rows, "n_classes": n_classes,
                "majority_share": maj, "numeric_share": num, "tvd": tvd, "ks": np.nan if is_cls else 0.03,
                "ks_pvalue": np.nan if is_cls else 0.9, "wasserstein": np.nan if is_cls else 0.01,
                "redraws": 1, "exact_duplicates": 3, "feature_duplicates": 2, "raw_record": CANARY,
            })
    write_parquet_atomic(pd.DataFrame(split_rows), run_dir / "split_report.parquet")

    offsets = (0.01, -0.01, 0.02, -0.02)  # sum to zero over the trained epochs: means are exact
    manip_rows = []
    manipulations = {**MANIPULATIONS, **{name: ("position", MANIPULATIONS["base"][1]) for name in noop}}
    for mode, (task, lr, q) in ((m, k) for m in label_modes for k in PLAN):
        rid = run_id("single_fixed", task, lr, q, mode)
        for e in EPOCHS:
            for name, (cat, mean) in manipulations.items():
                if e == 0:
                    auc = 0.99 if name == "skew_incorrect_k1_x2" else 0.5
                else:
                    auc = mean + offsets[TRAINED.index(e)]
                manip_rows.append({"run_id": rid, "epoch": e, "manipulation": name, "category": cat, "auc": auc,
                                   "raw_record": CANARY})
    manip = pd.DataFrame(manip_rows).merge(results[["run_id", "epoch"]].drop_duplicates(), on=["run_id", "epoch"])
    write_parquet_atomic(manip, run_dir / "manipulation_auc.parquet")

    roc_dir = run_dir / "roc"
    roc_dir.mkdir(exist_ok=True)
    peak_rows = results[(results["regime"] == "single_fixed") & (results["epoch"] > 0)]
    for r in peak_rows.itertuples(index=False):
        if (r.task, r.lr, r.q) == NO_ROC_RUN:
            continue
        if r.epoch not in (1, PLAN[(r.task, r.lr, r.q)][1]):  # the peak and epoch 1 only: keeps it fast
            continue
        write_parquet_atomic(_roc(min(max(r.auc, 0.05), 0.95)), roc_dir / f"roc_{r.run_id}_e{r.epoch}.parquet")

    # Made by the real writer; the config holds a raw record, which must not reach any report.
    record = Provenance.collect(kind="tabular", sweep_name="synthetic", config_hash="cfg123", seeds=[0],
                                config={"tasks": [{"name": "bin_task", "raw_records": [CANARY]}]})
    dataclasses.replace(record, git_commit="abc123").write(run_dir)
    return run_dir


def expected_peak_epoch(task: str, lr: float, q: int) -> int:
    return PLAN[(task, lr, q)][1]


# ----------------------------------------------------------------------------------------------
# Reading a W&B offline transaction log (run-*.wandb): LevelDB-style log records of protobuf Records.
# ----------------------------------------------------------------------------------------------

_BLOCK = 32768
_HEADER = 7  # ":W&B" + magic + version


def read_wandb_records(path: str | Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
    pos, chunks, buf = _HEADER, [], b""
    while pos + 7 <= len(data):
        left = _BLOCK - (pos % _BLOCK)
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            chunks.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            chunks.append(buf + chunk)
            buf = b""
    records = []
    for c in chunks:
        r = pb.Record()
        r.ParseFromString(c)
        records.append(r)
    return records


def _item_key(item) -> str:
    return item.key or "/".join(item.nested_key)


def wandb_history(records) -> list[dict]:
    """The history rows of a transaction log, in logging order."""
    return [{_item_key(i): json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


def wandb_config(records) -> dict:
    """The run's config as it stands at the end of the log (the run record's, then later updates)."""
    out = {}
    for r in records:
        kind = r.WhichOneof("record_type")
        for item in r.run.config.update if kind == "run" else r.config.update if kind == "config" else []:
            out[_item_key(item)] = json.loads(item.value_json)
    return out


def wandb_summary(records) -> dict:
    """The run's summary at the end of the log; nested keys (e.g. a table's metadata) become nested dicts."""
    out: dict = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            for item in r.summary.update:
                path = [item.key] if item.key else list(item.nested_key)
                node = out
                for part in path[:-1]:
                    node = node.setdefault(part, {})
                node[path[-1]] = json.loads(item.value_json)
    return out
