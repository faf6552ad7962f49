"""The adapter contract, on every registered model whose package is importable.

Each adapter is built tiny and randomly initialised from its real architecture code (no downloaded
weights): TabICL with embed_dim 16 and one block per stage, TabPFN v2 with emsize 16 and one layer,
ConTextTab at ModelSize.tiny, pfn-mini with d_model 16. An adapter whose optional package is missing
is skipped with the extra to install.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

import trainables.models  # noqa: F401  (registers the built-in adapters)
import trainables.models.contexttab_adapter  # noqa: F401  (registers contexttab, whatever __init__ imports)
import trainables.models.tabicl_adapter  # noqa: F401
import trainables.models.tabpfn_adapter  # noqa: F401
from iclmem.errors import CheckpointError, ModelError
from trainables.models import MODELS, build_model
from trainables.models.extras import extra_is_installed, extra_status, require_extra

TABICL_TINY = dict(embed_dim=16, col_num_blocks=1, col_nhead=2, col_num_inds=8, row_num_blocks=1, row_nhead=2,
                   row_num_cls=2, icl_num_blocks=1, icl_nhead=2, zero_init=False)
TABPFN_TINY = dict(emsize=16, nlayers=1, nhead=2)

# Tiny, randomly initialised instances of every adapter this suite knows how to shrink.
CLASSIFIERS: dict[str, dict[str, Any]] = {
    "pfn-mini": dict(weights="random", d_model=16, n_layers=1, n_heads=2, d_ff=32),
    "tabicl": dict(weights="random", **TABICL_TINY),
    "tabpfn-v2": dict(weights="random", **TABPFN_TINY),
    "contexttab": dict(weights="random", model_size="tiny"),
}
REGRESSORS: dict[str, dict[str, Any]] = {
    "tabicl": dict(weights="random", task="regression", num_quantiles=49, **TABICL_TINY),
    "tabpfn-v2": dict(weights="random", task="regression", num_buckets=64, **TABPFN_TINY),
}

B, N, M, F, C = 3, 12, 4, 5, 3


def _require(name: str) -> None:
    if name not in CLASSIFIERS and name not in REGRESSORS:
        pytest.skip(f"{name}: no tiny instance known to this suite")
    if not extra_is_installed(name):
        pytest.skip(f"{name}: {extra_status(name)}")


def _classifier(name: str, **overrides: Any):
    _require(name)
    if name not in CLASSIFIERS:
        pytest.skip(f"{name}: no tiny classifier known to this suite")
    return build_model(name, **{**CLASSIFIERS[name], **overrides})


def _regressor(name: str, **overrides: Any):
    _require(name)
    return build_model(name, **{**REGRESSORS[name], **overrides})


def _batch(seed: int = 0, n_classes: int = C):
    g = torch.Generator().manual_seed(seed)
    cx = torch.randn(B, N, F, generator=g)
    cy = torch.stack([torch.randperm(N, generator=g) % n_classes for _ in range(B)])  # every label present
    qx = torch.randn(B, M, F, generator=g)
    qy = torch.randint(n_classes, (B, M), generator=g)
    return cx, cy, qx, qy


def _regression_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cx = torch.randn(B, N, F, generator=g)
    qx = torch.randn(B, M, F, generator=g)
    cyv = 50.0 + 10.0 * torch.randn(B, N, generator=g)  # raw target units, not standardised
    candidates = torch.tensor([30.0, 45.0, 50.0, 55.0, 70.0])
    q_idx = torch.randint(len(candidates), (B, M), generator=g)
    return cx, cyv, qx, candidates, q_idx


ALL = MODELS.names()
REG = sorted(REGRESSORS)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    # Tiny models on a shared 2-core machine: intra-op threads only spin against each other.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -------------------------------------------------------------------------------------------- classifiers
@pytest.mark.parametrize("name", ALL)
def test_probabilities_cover_exactly_the_candidate_set(name):
    model = _classifier(name)
    cx, cy, qx, _ = _batch()
    with torch.no_grad():
        for n_classes in (2, 3, 5):
            lp = model.log_probs(cx, cy % n_classes, qx, n_classes)
            assert lp.shape == (B, M, n_classes)
            assert lp.dtype == torch.float32
            assert torch.isfinite(lp).all()
            torch.testing.assert_close(lp.exp().sum(-1), torch.ones(B, M))


@pytest.mark.parametrize("name", ALL)
def test_too_many_labels_are_refused(name):
    model = _classifier(name)
    cx, cy, qx, _ = _batch()
    with pytest.raises(ModelError, match="at most"):
        model.log_probs(cx, cy, qx, model.max_classes + 1)


@pytest.mark.parametrize("name", ALL)
def test_batched_contexts_equal_one_by_one(name):
    model = _classifier(name)
    cx, cy, qx, _ = _batch()
    with torch.no_grad():
        batched = model.log_probs(cx, cy, qx, C)
        single = torch.cat([model.log_probs(cx[i : i + 1], cy[i : i + 1], qx[i : i + 1], C) for i in range(B)])
        alone = model.log_probs(cx[1:2], cy[1:2], qx[1:2, 2:3], C)  # a query does not see the other queries
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batched[1:2, 2:3], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ALL)
def test_a_probe_context_of_identical_rows_gives_finite_scores(name):
    """Every context row carries the query's features (as in a probe): nothing may divide by a zero spread."""
    model = _classifier(name)
    qx = torch.randn(B, 1, F, generator=torch.Generator().manual_seed(5))
    cx = qx.expand(B, N, F).clone()
    cy = torch.arange(N).repeat(B, 1) % C
    with torch.no_grad():
        lp = model.log_probs(cx, cy, qx, C)
    assert torch.isfinite(lp).all()
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(B, 1))
    if name in REGRESSORS:
        reg = _regressor(name)
        with torch.no_grad():
            for values in (torch.full((B, N), 5.0), 5.0 + cy.float()):  # constant targets too
                lp = reg.candidate_log_probs(cx, values, qx, torch.tensor([4.0, 5.0, 6.0]))
                assert torch.isfinite(lp).all()


def _nll(model, cx, cy, qx, qy, n_classes=C) -> torch.Tensor:
    lp = model.log_probs(cx, cy, qx, n_classes)
    return torch.nn.functional.nll_loss(lp.reshape(-1, n_classes), qy.reshape(-1))


@pytest.mark.parametrize("name", ALL)
def test_a_finetuning_step_changes_the_weights_and_lowers_the_loss(name):
    model = _classifier(name)
    cx, cy, qx, qy = _batch(seed=1)
    params = model.trainable_parameters()
    assert params
    assert all(p.dtype == torch.float32 for p in params)
    before_weights = [p.detach().clone() for p in params]
    model.module.eval()
    with torch.no_grad():
        loss_before = _nll(model, cx, cy, qx, qy).item()
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    model.module.train()  # as trainables.finetune.Finetuner does
    optimizer.zero_grad()
    loss = _nll(model, cx, cy, qx, qy)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
    optimizer.step()
    model.module.eval()
    with torch.no_grad():
        loss_after = _nll(model, cx, cy, qx, qy).item()
    assert any(not torch.equal(a, p) for a, p in zip(before_weights, params))
    assert all(p.dtype == torch.float32 for p in model.trainable_parameters())
    assert loss_after < loss_before


@pytest.mark.parametrize("name", ALL)
def test_save_load_round_trips_bit_exactly(name, tmp_path):
    model = _classifier(name, seed=3)
    with torch.no_grad():  # perturb so the file cannot match a fresh init by chance
        for p in model.trainable_parameters():
            p.add_(0.01 * torch.randn_like(p))
    path = tmp_path / f"{name}.safetensors"
    model.save(path)
    other = _classifier(name, seed=99, weights=str(path))
    state, other_state = model.module.state_dict(), other.module.state_dict()
    assert state.keys() == other_state.keys()
    for key, value in state.items():
        assert torch.equal(value, other_state[key]), key
    cx, cy, qx, _ = _batch()
    with torch.no_grad():
        assert torch.equal(model.log_probs(cx, cy, qx, C), other.log_probs(cx, cy, qx, C))
    # ...and through the in-place path trainables.finetune uses on restore.
    third = _classifier(name, seed=7)
    third.load(path)
    with torch.no_grad():
        assert torch.equal(model.log_probs(cx, cy, qx, C), third.log_probs(cx, cy, qx, C))


def _skewed(cx: torch.Tensor, cy: torch.Tensor, label: int, copies: int = 3):
    """Duplicate every context row of ``label`` ``copies`` times (it becomes the most frequent label)."""
    xs, ys = [], []
    for b in range(cx.shape[0]):
        rows = (cy[b] == label).nonzero().flatten()
        extra = rows.repeat(copies)
        xs.append(torch.cat([cx[b], cx[b, extra]]))
        ys.append(torch.cat([cy[b], cy[b, extra]]))
    return torch.stack(xs), torch.stack(ys)


def _label_index_is_fixed(model, cx: torch.Tensor, qx: torch.Tensor, n_classes: int = C) -> bool:
    """Behavioural check: a context whose rows all carry label k (the most extreme skew) must reach the
    network as label k, so different k give different predictions. A mapping by frequency rank, by
    order of appearance or by rank among the labels present sends every such context to index 0."""
    with torch.no_grad():
        outs = [model.log_probs(cx, torch.full(cx.shape[:2], k), qx, n_classes) for k in range(n_classes)]
    return all(
        not torch.allclose(outs[i], outs[j], atol=1e-6) for i in range(n_classes) for j in range(i + 1, n_classes)
    )


@pytest.mark.parametrize("name", ALL)
def test_label_mapping_is_invariant_under_skew(name):
    model = _classifier(name)
    cx, cy, qx, _ = _batch(seed=2)
    for label in range(C):
        sx, sy = _skewed(cx, cy, label)
        if hasattr(model, "label_ids"):
            # The ids the network sees: label j is id j in the original and in the skewed context.
            assert torch.equal(model.label_ids(cy), cy)
            assert torch.equal(model.label_ids(sy), sy)
        with torch.no_grad():
            lp = model.log_probs(sx, sy, qx, C)
        assert lp.shape == (B, M, C)
        torch.testing.assert_close(lp.exp().sum(-1), torch.ones(B, M))
    assert _label_index_is_fixed(model, cx, qx)


def test_the_skew_check_catches_a_frequency_ranked_label_mapping():
    """Negative control: an adapter that ranks labels by context frequency (as ConTextTab's wrapper does)
    fails the behavioural check above."""
    from trainables.models.embedded import PfnMiniAdapter

    class FrequencyRanked(PfnMiniAdapter):
        def _logits(self, context_x, context_y, query_x):
            ranked = torch.empty_like(context_y)
            for b in range(context_y.shape[0]):
                counts = torch.bincount(context_y[b], minlength=self.max_classes)
                order = torch.argsort(-counts, stable=True)  # most frequent label first
                rank = torch.empty_like(order)
                rank[order] = torch.arange(len(order))
                ranked[b] = rank[context_y[b]]
            return self.module(context_x, ranked, query_x)

    base = build_model("pfn-mini", **CLASSIFIERS["pfn-mini"])
    ranked = FrequencyRanked(base.module, base.options)
    cx, _, qx, _ = _batch(seed=2)
    assert _label_index_is_fixed(base, cx, qx)
    assert not _label_index_is_fixed(ranked, cx, qx)


@pytest.mark.parametrize("name", ALL)
def test_a_missing_local_checkpoint_fails_at_once_with_its_path(name, tmp_path):
    missing = tmp_path / "no-such-dir" / f"{name}-weights.ckpt"
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=f"{name}-weights.ckpt"):
        build_model(name, weights=str(missing))
    assert time.perf_counter() - start < 5.0


def test_require_extra_names_the_pip_extra():
    with pytest.raises(ModelError, match=r"pip install iclmem\[somextra\]"):
        require_extra("no_such_module_iclmem_test", "somextra")


def test_extra_status_says_whether_the_extra_is_installed():
    assert "built in" in extra_status("pfn-mini")
    for name in ("tabicl", "tabpfn-v2", "contexttab"):
        status = extra_status(name)
        assert status.startswith("installed") == extra_is_installed(name)
        if not extra_is_installed(name):
            assert "pip install iclmem[" in status


@pytest.mark.parametrize("name", ["tabicl", "tabpfn-v2", "contexttab"])
def test_hub_weights_never_download_unless_allowed(name, monkeypatch, tmp_path):
    _require(name)
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def fake_download(*args, local_files_only=False, **kwargs):
        if not local_files_only:
            raise AssertionError("a download was attempted")
        raise LocalEntryNotFoundError("not cached (test)")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    if name == "tabpfn-v2":
        import tabpfn.model_loading

        monkeypatch.setattr(tabpfn.model_loading, "get_cache_dir", lambda: tmp_path)
    with pytest.raises(CheckpointError, match="allow_download"):
        build_model(name, weights="hub")


# -------------------------------------------------------------------------------------------- regressors
@pytest.mark.parametrize("name", REG)
def test_native_candidates_are_a_distribution_over_exactly_the_candidates(name):
    model = _regressor(name)
    cx, cyv, qx, candidates, _ = _regression_batch()
    with torch.no_grad():
        lp = model.candidate_log_probs(cx, cyv, qx, candidates)
        assert lp.shape == (B, M, len(candidates))
        assert lp.dtype == torch.float32
        torch.testing.assert_close(lp.exp().sum(-1), torch.ones(B, M))
        # The candidates are scored independently: permuting them permutes the scores.
        perm = torch.tensor([3, 0, 4, 1, 2])
        torch.testing.assert_close(model.candidate_log_probs(cx, cyv, qx, candidates[perm]), lp[..., perm])
        # A fixed (task-level) target scaling is honoured and changes nothing about normalisation.
        fixed = model.candidate_log_probs(cx, cyv, qx, candidates, target_loc=40.0, target_scale=20.0)
        torch.testing.assert_close(fixed.exp().sum(-1), torch.ones(B, M))
    with pytest.raises(ModelError, match="candidate_log_probs"):
        model.log_probs(cx, torch.zeros(B, N, dtype=torch.long), qx, 2)


@pytest.mark.parametrize("name", REG)
def test_native_candidates_batched_equal_one_by_one(name):
    model = _regressor(name)
    cx, cyv, qx, candidates, _ = _regression_batch()
    with torch.no_grad():
        batched = model.candidate_log_probs(cx, cyv, qx, candidates)
        single = torch.cat([model.candidate_log_probs(cx[i : i + 1], cyv[i : i + 1], qx[i : i + 1], candidates)
                            for i in range(B)])
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", REG)
def test_native_candidates_finetune_and_round_trip(name, tmp_path):
    model = _regressor(name)
    cx, cyv, qx, candidates, q_idx = _regression_batch(seed=1)

    def loss_fn():
        lp = model.candidate_log_probs(cx, cyv, qx, candidates)
        return torch.nn.functional.nll_loss(lp.reshape(-1, len(candidates)), q_idx.reshape(-1))

    with torch.no_grad():
        loss_before = loss_fn().item()
    optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=1e-3)
    model.module.train()
    optimizer.zero_grad()
    loss_fn().backward()
    optimizer.step()
    model.module.eval()
    with torch.no_grad():
        assert loss_fn().item() < loss_before
    path = tmp_path / f"{name}-regressor.safetensors"
    model.save(path)
    other = _regressor(name, seed=5, weights=str(path))
    for key, value in model.module.state_dict().items():
        assert torch.equal(value, other.module.state_dict()[key]), key
    with torch.no_grad():
        assert torch.equal(model.candidate_log_probs(cx, cyv, qx, candidates),
                           other.candidate_log_probs(cx, cyv, qx, candidates))


# -------------------------------------------------------------------------------------------- fidelity
def test_tabicl_scores_equal_tabicls_own_forward_in_float32_whatever_the_autocast():
    _require("tabicl")
    from tabicl._model.inference_config import InferenceConfig

    model = _classifier("tabicl")
    cx, cy, qx, _ = _batch()
    off = {"use_amp": False, "device": "cpu"}
    config = InferenceConfig(COL_CONFIG={**off, "offload": False}, ROW_CONFIG=off, ICL_CONFIG=off)
    with torch.no_grad():
        ours = model.log_probs(cx, cy, qx, C)
        own = model.module(torch.cat([cx, qx], 1), cy.float(), inference_config=config)  # eval: [B, M, C]
        torch.testing.assert_close(ours, torch.log_softmax(own, -1), atol=1e-6, rtol=1e-6)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under_autocast = model.log_probs(cx, cy, qx, C)
    assert torch.equal(ours, under_autocast)


def test_tabicl_loads_an_official_format_checkpoint(tmp_path):
    _require("tabicl")
    model = _classifier("tabicl", seed=4)
    path = tmp_path / "tabicl-classifier-test.ckpt"
    torch.save({"config": model.options["config"], "state_dict": model.module.state_dict()}, path)
    loaded = build_model("tabicl", weights=str(path))
    cx, cy, qx, _ = _batch()
    with torch.no_grad():
        assert torch.equal(model.log_probs(cx, cy, qx, C), loaded.log_probs(cx, cy, qx, C))
    with pytest.raises(ModelError, match="task='regression'"):
        build_model("tabicl", weights=str(path), task="regression")


def test_tabpfn_fixed_labels_equal_tabpfn_densified_labels_when_all_are_present():
    _require("tabpfn-v2")
    model = _classifier("tabpfn-v2")
    densified = _classifier("tabpfn-v2", densify_labels=True)
    cx, cy, qx, _ = _batch()
    with torch.no_grad():
        torch.testing.assert_close(model.log_probs(cx, cy, qx, C), densified.log_probs(cx, cy, qx, C))
        # With a label absent TabPFN's densification shifts the others; the adapter's default does not.
        gap = torch.where(cy == 1, torch.zeros_like(cy), cy)
        assert torch.equal(densified.label_ids(gap)[gap == 2], torch.ones_like(gap[gap == 2]))
        assert torch.equal(model.label_ids(gap), gap)
    assert not _label_index_is_fixed(densified, cx, qx)


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_tabpfn_loads_an_official_format_checkpoint_through_tabpfns_loader(task, tmp_path):
    _require("tabpfn-v2")
    from tabpfn.checkpoint import save_as_safetensors

    model = _classifier("tabpfn-v2", seed=4) if task == "classification" else _regressor("tabpfn-v2", seed=4)
    state = dict(model.module.state_dict())
    if task == "regression":
        state.update({f"criterion.{k}": v for k, v in model.criterion.state_dict().items()})
    path = tmp_path / f"tabpfn-v2-{task}-test.safetensors"
    save_as_safetensors({"config": model.options["config"], "state_dict": state}, path)  # tabpfn's format
    loaded = build_model("tabpfn-v2", weights=str(path))
    assert loaded.task == task
    with torch.no_grad():
        if task == "classification":
            cx, cy, qx, _ = _batch()
            assert torch.equal(model.log_probs(cx, cy, qx, C), loaded.log_probs(cx, cy, qx, C))
        else:
            cx, cyv, qx, candidates, _ = _regression_batch()
            assert torch.equal(model.candidate_log_probs(cx, cyv, qx, candidates),
                               loaded.candidate_log_probs(cx, cyv, qx, candidates))


def test_contexttab_tokenizes_like_tabtune_without_its_server_label_ranking_or_column_dropping():
    _require("contexttab")
    import numpy as np
    import pandas as pd
    from tabtune.models.contexttab.data.tokenizer import Tokenizer

    model = _classifier("contexttab", feature_scaling="context")
    from trainables.data import TableColumns

    model.use_columns(TableColumns.numbers(["age", "income", "height", "weight", "score"], "label"))
    cx, cy, qx, _ = _batch()
    cx[0, :, 2] = 1.5  # a constant context column (tabtune's wrapper would drop it)
    qx[0, :, 2] = 1.5
    ours = model.tokenize(cx[0], cy[0], qx[0])

    tokenizer = Tokenizer(regression_type="l2", classification_type="cross-entropy", random_seed=42, is_valid=True)
    tokenizer.texts_to_tensor = lambda texts: model.embedder.embed([str(t) for t in texts])  # no ZMQ server
    names = model.column_texts(range(F))
    assert names == ["age", "income", "height", "weight", "score", "label"]
    X_ctx = pd.DataFrame(cx[0].double().numpy(), columns=names[:-1])
    X_qry = pd.DataFrame(qx[0].double().numpy(), columns=names[:-1])
    y_ctx = pd.DataFrame({names[-1]: cy[0].numpy()})
    y_qry = pd.DataFrame({names[-1]: np.zeros(M, dtype=np.int64)})
    theirs, _, label_classes = tokenizer(X_ctx, y_ctx, X_qry, y_qry, "classification")

    assert torch.equal(ours["column_embeddings"], theirs["column_embeddings"])
    torch.testing.assert_close(ours["number_normalized"], theirs["number_normalized"], atol=1e-5, rtol=1e-5)
    assert torch.equal(ours["date_year_month_day_weekday"], theirs["date_year_month_day_weekday"])
    # Query targets are masked the same way; context targets are the labels themselves here, while
    # tabtune orders them by frequency and shuffles (label_classes[i] is the label given id i).
    assert torch.equal(ours["target"][N:], theirs["target"][N:])
    remapped = torch.tensor([int(label_classes[int(t)]) for t in theirs["target"][:N]], dtype=torch.float32)
    assert torch.equal(ours["target"][:N], remapped)


def test_contexttab_listens_nowhere_and_starts_no_process():
    _require("contexttab")
    import psutil

    me = psutil.Process()

    def listening() -> set:
        return {(c.laddr.ip, c.laddr.port) for c in me.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}

    # Compare with what already listened (e.g. the test session's Ray driver), not with nothing.
    listening_before = listening()
    children_before = {p.pid for p in me.children(recursive=True)}
    model = _classifier("contexttab")
    cx, cy, qx, _ = _batch()
    with torch.no_grad():
        model.log_probs(cx, cy, qx, C)
    opened = listening() - listening_before
    assert not opened, opened
    assert {p.pid for p in me.children(recursive=True)} <= children_before


def test_contexttab_loads_a_weight_shared_official_checkpoint(tmp_path):
    _require("contexttab")
    model = _classifier("contexttab", seed=4)
    state = model.module.state_dict()
    last = model.module.config.num_hidden_layers - 1
    shared = {("module." + k): v for k, v in state.items()
              if not k.startswith("in_context_encoder.") or k.startswith(f"in_context_encoder.{last}.")}
    path = tmp_path / "sap-rpt-test.pt"
    torch.save(shared, path)
    loaded = build_model("contexttab", weights=str(path))
    assert loaded.options["model_size"] == "tiny"
    for key, value in loaded.module.state_dict().items():
        if key.startswith("in_context_encoder."):
            suffix = key.split(".", 2)[2]
            assert torch.equal(value, state[f"in_context_encoder.{last}.{suffix}"]), key
        else:
            assert torch.equal(value, state[key]), key


@pytest.mark.parametrize(("name", "module"), [("tabicl", "tabicl"), ("tabpfn-v2", "tabpfn"), ("contexttab", "tabtune")])
def test_a_missing_package_is_a_model_error_naming_the_extra(name, module, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, module, None)  # makes `import <module>` fail as if not installed
    extra = {"tabicl": "tabicl", "tabpfn-v2": "tabpfn", "contexttab": "contexttab"}[name]
    assert extra_status(name).startswith("extra missing")
    assert f"iclmem[{extra}]" in extra_status(name)
    with pytest.raises(ModelError, match=rf"pip install iclmem\[{extra}\]"):
        build_model(name, weights="random")
