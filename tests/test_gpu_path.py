"""The device path: where fine-tuning and probing run, batch sizing, float32 scores; on CUDA when present."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from iclmem.errors import ModelError
from probes.manipulations import default_suite
from probes.scoring import ProbePlan, ProbeQueries, icl_predictions, score
from trainables.data import TaskSource, prepare_task
from trainables.finetune import Finetuner, FinetuneSpec
from trainables.models import build_model
from trainables.models.base import resolve_device

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


@pytest.fixture(scope="module")
def task():
    return prepare_task(TaskSource("iris", "builtin"), seed=0, q=20, context_size=40)


@pytest.fixture(scope="module")
def plan(task):
    return ProbePlan.build(ProbeQueries.from_task(task), default_suite(), task.seed, compress_rows=True)


def test_an_explicit_device_is_taken_as_given_and_auto_follows_cuda_availability(monkeypatch):
    monkeypatch.delenv("ICLMEM_DEVICE", raising=False)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("ICLMEM_DEVICE", "cpu")
    assert resolve_device(None) == torch.device("cpu")


def test_auto_device_inside_ray_without_gpus_is_the_cpu(monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.delenv("ICLMEM_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU in the machine ...
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: [])  # ... but none given to this worker
    assert resolve_device(None) == torch.device("cpu")
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: [0])
    assert resolve_device(None) == torch.device("cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where there is no CUDA")
def test_asking_for_cuda_without_a_cuda_device_names_the_problem():
    with pytest.raises(ModelError, match="no CUDA device"):
        resolve_device("cuda")


class OutOfMemoryAbove:
    """Wraps a model; a forward of more than ``limit`` contexts raises CUDA's out-of-memory error."""

    def __init__(self, model, limit: int) -> None:
        self.inner, self.limit, self.batches = model, limit, []
        self.module, self.invariances = model.module, model.invariances

    def log_probs(self, context_x, *args, **kwargs):
        if context_x.shape[0] > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        self.batches.append(context_x.shape[0])
        return self.inner.log_probs(context_x, *args, **kwargs)


def test_score_halves_its_batches_until_they_fit_and_gives_the_same_scores(plan):
    model = build_model("pfn-mini")
    limited = OutOfMemoryAbove(model, limit=100)
    table = score(limited, plan)
    rep = plan.representatives(model.invariances)
    assert max(limited.batches) <= 100
    assert sum(limited.batches) == int((rep == np.arange(rep.size)).sum())  # every context forwarded once
    expected = score(model, plan)
    for column in ("loss", "entropy", "confidence"):
        np.testing.assert_allclose(table[column], expected[column], atol=1e-5)


def test_a_batch_size_given_by_the_caller_is_not_shrunk(plan):
    with pytest.raises(torch.OutOfMemoryError):
        score(OutOfMemoryAbove(build_model("pfn-mini"), limit=100), plan, max_batch=1000)


def test_score_tables_are_float32(plan):
    table = score(build_model("pfn-mini"), plan)
    assert all(table[c].dtype == np.float32 for c in ("loss", "entropy", "confidence"))


def test_finetuner_keeps_model_and_batches_on_its_device_and_checkpoints_load_on_the_cpu(task, tmp_path):
    device = resolve_device(None)
    finetuner = Finetuner(FinetuneSpec(epochs=2), [task], device=device)
    assert finetuner.model.device.type == device.type
    assert all(b.context_x.device.type == device.type for b in finetuner.batches(1))
    finetuner.train()
    finetuner.save(tmp_path / "ckpt")
    again = Finetuner(FinetuneSpec(epochs=3), [task], device="cpu")
    again.restore(tmp_path / "ckpt")
    assert again.epoch == 2
    assert again.model.device.type == "cpu"
    again.train()  # the optimizer state came back onto the CPU with the weights


@needs_cuda
def test_probe_scores_on_cuda_match_the_cpu(plan, task):
    cpu_model = build_model("pfn-mini")
    gpu_model = build_model("pfn-mini").to("cuda")
    on_cpu, on_gpu = score(cpu_model, plan), score(gpu_model, plan)
    assert all(on_gpu[c].dtype == np.float32 for c in ("loss", "entropy", "confidence"))
    for column in ("loss", "entropy", "confidence"):
        np.testing.assert_allclose(on_gpu[column], on_cpu[column], atol=1e-4, rtol=1e-4)
    for a, b in zip(icl_predictions(cpu_model, task), icl_predictions(gpu_model, task)):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


@needs_cuda
def test_fine_tuning_on_cuda_follows_the_cpu_run(task):
    losses = {}
    for device in ("cpu", "cuda"):
        finetuner = Finetuner(FinetuneSpec(epochs=5, lr=1e-3), [task], device=device)
        losses[device] = [r.train_loss for r in finetuner.train()]
    np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=1e-3, atol=1e-4)
