"""Determinism: the same inputs and seed give byte-identical score tables and identical verdicts,
whether probed in-process, by one probe actor or by two."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from iclmem.record import VOLATILE_COLUMNS, RunIdentity
from probes.actors import ProbeJob, ProbePool
from probes.calibration import model_digest
from probes.manipulations import default_suite
from probes.probe import ProbeSettings
from probes.scoring import ProbePlan, ProbeQueries, score
from trainables.data import TaskSource, prepare_task
from trainables.finetune import Finetuner, FinetuneSpec
from trainables.models import build_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("det")
    task = prepare_task(TaskSource("iris", "builtin"), label_mode="shuffled_members", seed=3, q=30, context_size=60)
    finetuner = Finetuner(FinetuneSpec(lr=1e-3, epochs=5, seed=3), [task])
    finetuner.train()
    return root, task, finetuner.save(root / "ckpt")


def test_score_tables_are_byte_identical_on_repeated_runs(setup):
    _, task, checkpoint = setup
    from trainables.finetune import load_checkpoint_model

    tables = []
    for _ in range(2):
        plan = ProbePlan.build(ProbeQueries.from_task(task), default_suite(), task.seed)
        tables.append(score(load_checkpoint_model(checkpoint), plan))
    assert tables[0].equals(tables[1])
    for column in ("loss", "entropy", "confidence"):
        assert tables[0][column].to_numpy().tobytes() == tables[1][column].to_numpy().tobytes()


def test_prepared_tasks_are_byte_identical_for_the_same_seed():
    a = prepare_task(TaskSource("wine", "builtin"), label_mode="shuffled_all", seed=5, q=30, context_size=60)
    b = prepare_task(TaskSource("wine", "builtin"), label_mode="shuffled_all", seed=5, q=30, context_size=60)
    assert a == b
    assert a.fingerprint == b.fingerprint


def _pool_rows(n_actors: int, root: Path, task, checkpoint) -> list[dict]:
    import ray

    base = build_model("pfn-mini")
    pool = ProbePool(
        n_actors, {"num_cpus": 0.5}, base_model_name="pfn-mini", base_options={"weights": "shipped"},
        base_weights=ray.put(base.state_arrays()), base_digest=model_digest(base),
        tasks=ray.put({task.fingerprint: task}), suite_spec="default",
        settings=ProbeSettings(n_resamples=100), cache_dir=str(root / f"ref{n_actors}"),
    )
    out = root / f"probes{n_actors}"
    try:
        for epoch, ckpt in ((0, None), (5, str(checkpoint)), (6, str(checkpoint))):
            identity = RunIdentity("r", "iris", "pfn-mini", "single_fixed", 1e-3, 30, "normal", 0).as_dict()
            pool.submit(ProbeJob(identity, epoch, ckpt, task.fingerprint, str(out), f"e{epoch}"))
        rows = pool.drain()
    finally:
        pool.shutdown()
    return sorted(rows, key=lambda r: r["epoch"])


@pytest.mark.slow  # fine-tunes and starts probe actors (`make test-fast` leaves it out)
def test_verdicts_are_identical_with_one_or_two_probe_actors(setup, ray_session):
    root, task, checkpoint = setup
    one, two = _pool_rows(1, root, task, checkpoint), _pool_rows(2, root, task, checkpoint)
    volatile = set(VOLATILE_COLUMNS)
    strip = lambda row: json.dumps({k: v for k, v in row.items() if k not in volatile}, sort_keys=True, default=str)
    assert [strip(r) for r in one] == [strip(r) for r in two]
    assert one[0]["outcome"] == "no_signal"
    for n in (1, 2):
        manip = [pd.read_parquet(root / f"probes{n}" / f"e{e}.manip.parquet") for e in (5, 6)]
        assert manip[0].drop(columns="epoch").equals(manip[1].drop(columns="epoch"))
