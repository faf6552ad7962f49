"""The adapter contract, on the embedded model (random and shipped weights)."""

from __future__ import annotations

import pickle

import pytest
import torch

from iclmem.errors import CheckpointError, ModelError, UnknownNameError
from trainables.models import MODELS, build_model, read_weights


def _batch(b=3, n=6, m=4, f=5, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, n, f, generator=g), torch.randint(c, (b, n), generator=g),
            torch.randn(b, m, f, generator=g))


def test_log_probs_are_normalised_over_exactly_the_candidate_set():
    model = build_model("pfn-mini", weights="random")
    cx, cy, qx = _batch(c=3)
    for n_classes in (2, 3, 7):
        lp = model.log_probs(cx, cy % n_classes, qx, n_classes)
        assert lp.shape == (3, 4, n_classes)
        assert lp.dtype == torch.float32
        torch.testing.assert_close(lp.exp().sum(-1), torch.ones(3, 4))


def test_batched_contexts_equal_one_by_one_predictions():
    model = build_model("pfn-mini", weights="random")
    cx, cy, qx = _batch()
    with torch.no_grad():
        batched = model.log_probs(cx, cy, qx, 3)
        single = torch.cat([model.log_probs(cx[i : i + 1], cy[i : i + 1], qx[i : i + 1], 3) for i in range(3)])
        # A query attends to context rows only, so predicting it alone gives the same answer.
        alone = model.log_probs(cx[:1], cy[:1], qx[:1, :1], 3)
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batched[:1, :1], alone, atol=1e-5, rtol=1e-5)


def test_checkpoint_round_trips_bit_exactly(tmp_path):
    model = build_model("pfn-mini", weights="random", seed=3)
    path = tmp_path / "w.safetensors"
    model.save(path)
    other = build_model("pfn-mini", weights=str(path), seed=99)
    for key, value in model.module.state_dict().items():
        assert torch.equal(value, other.module.state_dict()[key]), key
    cx, cy, qx = _batch()
    with torch.no_grad():
        assert torch.equal(model.log_probs(cx, cy, qx, 3), other.log_probs(cx, cy, qx, 3))


def test_state_arrays_round_trip_through_numpy():
    model = build_model("pfn-mini", weights="random", seed=1)
    arrays = model.state_arrays()
    for value in arrays.values():
        value.setflags(write=False)  # as ray.get hands them out
    other = build_model("pfn-mini", weights="random", seed=2)
    other.load_state_arrays(arrays)
    for key, value in model.module.state_dict().items():
        assert torch.equal(value, other.module.state_dict()[key])


def test_unknown_model_name_lists_the_known_ones():
    with pytest.raises(UnknownNameError, match=r"unknown model 'tabpfn-v9'.*pfn-mini"):
        build_model("tabpfn-v9")


def test_registry_rejects_duplicate_names():
    from iclmem.errors import DuplicateNameError

    with pytest.raises(DuplicateNameError):
        MODELS.register("pfn-mini", lambda **_: None)


def test_too_many_candidate_labels_are_refused():
    model = build_model("pfn-mini", weights="random")
    cx, cy, qx = _batch()
    with pytest.raises(ModelError, match="at most 10 candidate labels"):
        model.log_probs(cx, cy, qx, 11)


def test_missing_checkpoint_fails_at_once_with_its_path(tmp_path):
    missing = tmp_path / "nope.safetensors"
    with pytest.raises(CheckpointError, match="nope.safetensors"):
        build_model("pfn-mini", weights=str(missing))


def test_a_pickled_payload_in_a_checkpoint_is_refused(tmp_path):
    class Payload:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "evil.pt"
    with path.open("wb") as fh:
        pickle.dump({"w": Payload()}, fh)
    with pytest.raises(CheckpointError, match="refused to unpickle"):
        read_weights(path)


def test_shared_state_arrays_are_used_in_place_without_a_copy():
    model = build_model("pfn-mini", weights="random", seed=1)
    arrays = model.state_arrays()
    for value in arrays.values():
        value.setflags(write=False)
    other = build_model("pfn-mini", weights="random", seed=2)
    other.load_state_arrays(arrays, copy=False)
    first = next(iter(arrays))
    assert other.module.state_dict()[first].data_ptr() == arrays[first].__array_interface__["data"][0]
    cx, cy, qx = _batch()
    with torch.no_grad():
        torch.testing.assert_close(other.log_probs(cx, cy, qx, 3), model.log_probs(cx, cy, qx, 3))
