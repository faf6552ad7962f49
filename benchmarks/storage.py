"""What a run folder holds under each ``training.keep_checkpoints``: the quickstart's sweep, run once per value.

    python3 benchmarks/storage.py [--config configs/quickstart.yaml] [--no-write]

Each value is one real sweep (``orchestrator.driver.sweep.run_sweep``, W&B offline as the quickstart has it) in a fresh
folder. Recorded: the folder's bytes (files only, links not followed), of them the checkpoints' (Tune's
``checkpoint_*`` folders), what ``iclmem run`` predicted before it started (``orchestrator.estimate.estimate_disk``, no
timing), and whether the results table equals the ``all`` run's (the policy removes files after they are probed, so
it must not change a number).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, md_table, publish  # noqa: E402

SECTION = "Storage a user controls: the quickstart's folder under each training.keep_checkpoints"


def _bytes(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def main(argv: list[str] | None = None) -> int:
    import yaml

    from iclmem.record import VOLATILE_COLUMNS
    from iclmem.vocab import KeepCheckpoints
    from orchestrator.driver.sweep import run_sweep
    from orchestrator.estimate.estimate_disk import predict_disk, size_only_costs
    from orchestrator.estimate.estimate_work import count_work
    from orchestrator.runfolder.prepare import prepare_sweep
    from orchestrator.schema.sweep_files import load_sweep

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart.yaml"))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    base = yaml.safe_load(Path(args.config).read_text())
    rows, tables = [], {}
    with tempfile.TemporaryDirectory(prefix="iclmem-storage-") as tmp:
        for policy in KeepCheckpoints:
            config = Path(tmp) / f"{policy}.yaml"
            config.write_text(yaml.safe_dump({**base, "training": {**base.get("training", {}),
                                                                     "keep_checkpoints": str(policy)}}))
            sweep = load_sweep(config)
            predicted = predict_disk(count_work(sweep), size_only_costs(prepare_sweep(sweep, Path(tmp) / "scratch",
                                                                                      log=lambda _m: None)),
                                     policy, 2, wandb=str(sweep.wandb.mode) != "disabled")
            run_dir = Path(tmp) / f"run-{policy}"
            results = run_sweep(config, run_dir, progress=False, log=lambda _m: None)
            # every column but the timings and the config hash (the setting is part of the config it names)
            unequal = [*VOLATILE_COLUMNS, "config_hash"]
            tables[policy] = results.drop(columns=[c for c in unequal if c in results.columns]).sort_values(
                ["run_id", "epoch"]).reset_index(drop=True)
            total = _bytes(run_dir)
            checkpoints = sum(_bytes(p) for p in (run_dir / "tune").rglob("checkpoint_*") if p.is_dir())
            rows.append((policy, total, checkpoints, predicted.final_bytes))
    full = rows[0][1]
    same = {p: t.equals(tables[KeepCheckpoints.ALL]) or _close(t, tables[KeepCheckpoints.ALL]) for p, t in tables.items()}
    table = md_table(["training.keep_checkpoints", "run folder (MB)", "of it checkpoints (MB)", "share of `all`",
                      "predicted before the run (MB)", "predicted / written",
                      "results equal to `all`'s (timings and config hash aside)"],
                     [(f"`{p}`" + (" (default)" if p == KeepCheckpoints.WEIGHTS else ""), f"{t / 1e6:.1f}",
                       f"{c / 1e6:.1f}", f"{t / full:.0%}", f"{pr / 1e6:.1f}", f"{pr / t:.2f}",
                       "yes" if same[p] else "no") for p, t, c, pr in rows])
    text = "\n".join([
        f"`{Path(args.config).relative_to(REPO) if Path(args.config).is_relative_to(REPO) else args.config}`, one "
        "sweep per value. `all` is what every sweep kept before the setting existed (every checkpoint's weights "
        "and AdamW state).", "", table, "",
        "Reading: the default keeps every checkpoint's weights (re-auditing any epoch needs them) and drops the "
        "optimizer state once a checkpoint is no longer a running trial's latest: AdamW's two moments are twice the "
        "weights, so the checkpoints shrink to a third. `last` keeps one checkpoint's weights per run; `none` keeps "
        "manifests and ground-truth logs only (a removed checkpoint is recomputed from the run's config when a "
        "reader needs it). The rest of the folder (probe results, W&B offline runs, the report) is the same under "
        "every value."])
    publish(SECTION, text, args.no_write, argv)
    return 0


def _close(a: object, b: object) -> bool:
    import pandas as pd

    try:
        pd.testing.assert_frame_equal(a, b)  # type: ignore[arg-type]
        return True
    except AssertionError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
