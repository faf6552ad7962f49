"""Pretrain pfn-mini on TabICL's synthetic prior, on a CPU, resumably.

    python -m trainables.models.pretrain_pfn_mini --workdir .pretrain --steps 6000 --seed 0

Two processes cooperate: a generator (``--role generate``, started automatically) fills a pool of
prior batches from ``tabicl.prior.PriorDataset`` (mlp_scm and tree_scm, BSD-3) ahead of training,
since generating a table costs more than a training step on it; the trainer draws batches from that
pool, augments them (feature and class permutations, fresh context/query splits) so a pool batch can
be reused, and mixes in a cheap Gaussian-cluster prior (``--gmm-share``) that teaches the
nearest-class-mean behaviour real tables reward. Every ``--save-every`` steps it writes a resumable
state (model, optimizer, RNG, step) and appends evaluation accuracies to ``curve.jsonl``; ``--export``
writes the shipped weights with the exact command, seed and package versions that produced them.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from iclmem.atomic import atomic_write, write_text_atomic
from trainables.models.pfn_mini import PfnMini, PfnMiniConfig

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
EVAL_FEATURES = 16


# ----------------------------------------------------------------------------------------- generator
def generate_pool(pool: Path, seed: int, batch_size: int, max_batches: int) -> None:
    torch.set_num_threads(1)
    from tabicl.prior import PriorDataset

    pool.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - tabicl's prior draws from numpy's global generator: this seeds it
    random.seed(seed)
    priors = {
        kind: PriorDataset(
            batch_size=batch_size, batch_size_per_gp=4, min_features=2, max_features=18, max_classes=10,
            min_seq_len=48, max_seq_len=320, prior_type=kind, n_jobs=1, num_threads_per_generate=1,
        )
        for kind in ("mlp_scm", "tree_scm")
    }
    index = len(list(pool.glob("batch_*.pt")))
    while index < max_batches:
        kind = "mlp_scm" if index % 3 else "tree_scm"
        x, y, d, seq_lens, _ = priors[kind].get_batch()
        batch = {"x": x.float(), "y": y.long(), "d": d.long(), "seq_len": seq_lens.long()}
        atomic_write(pool / f"batch_{index:06d}.pt", lambda tmp, batch=batch: torch.save(batch, tmp), to_path=True)
        index += 1


# ----------------------------------------------------------------------------------------- batches
def standardize(x: torch.Tensor, n_features: torch.Tensor) -> torch.Tensor:
    # x: [B, L, F]; statistics over all rows of each table, as iclmem's preprocessing does per task.
    mean = x.mean(dim=1, keepdim=True)
    std = x.std(dim=1, keepdim=True).clamp_min(1e-6)
    out = ((x - mean) / std).clamp(-6, 6)
    live = torch.arange(x.shape[-1])[None, None, :] < n_features[:, None, None]
    return torch.where(live, out, torch.zeros_like(out))


def pool_batch(pool_files: list[Path], gen: torch.Generator, max_features: int):
    path = pool_files[int(torch.randint(len(pool_files), (1,), generator=gen))]
    data = torch.load(path, weights_only=True)
    x, y, d = data["x"], data["y"], data["d"]
    length = int(data["seq_len"].min())
    x, y = x[:, :length], y[:, :length]
    batch, _, width = x.shape
    # Augment: permute live feature columns and class ids per table, so pool batches can be reused.
    for b in range(batch):
        n = int(d[b])
        perm = torch.randperm(n, generator=gen)
        x[b, :, :n] = x[b, :, perm]
        n_cls = int(y[b].max()) + 1
        y[b] = torch.randperm(n_cls, generator=gen)[y[b]]
    if width < max_features:
        x = F.pad(x, (0, max_features - width))
    return standardize(x[..., :max_features], d), y, length


def gmm_batch(gen: torch.Generator, batch: int, max_features: int, max_classes: int):
    """Gaussian class clusters with a random share of irrelevant features and random scales."""
    length = int(torch.randint(48, 320, (1,), generator=gen))
    n_feat = torch.randint(1, max_features - 1, (batch,), generator=gen)
    n_cls = torch.randint(2, max_classes + 1, (batch,), generator=gen)
    x = torch.zeros(batch, length, max_features)
    y = torch.zeros(batch, length, dtype=torch.long)
    for b in range(batch):
        f, c = int(n_feat[b]), int(n_cls[b])
        spread = float(torch.empty(1).uniform_(0.3, 2.5, generator=gen))
        means = torch.randn(c, f, generator=gen) * spread
        relevant = torch.rand(f, generator=gen) < 0.7
        means[:, ~relevant] = 0
        scales = torch.empty(c, f).uniform_(0.5, 1.5, generator=gen)
        weights = torch.distributions.Dirichlet(torch.full((c,), 2.0)).sample()
        labels = torch.multinomial(weights, length, replacement=True, generator=gen)
        x[b, :, :f] = means[labels] + torch.randn(length, f, generator=gen) * scales[labels]
        y[b] = labels
    return standardize(x, n_feat), y, length


def split_loss(model: PfnMini, x: torch.Tensor, y: torch.Tensor, length: int, gen: torch.Generator):
    n_context = int(torch.randint(int(0.3 * length), int(0.85 * length), (1,), generator=gen))
    perm = torch.randperm(length, generator=gen)
    x, y = x[:, perm], y[:, perm]
    logits = model(x[:, :n_context], y[:, :n_context], x[:, n_context:])  # [B, M, C]
    n_cls = (y.max(dim=1).values + 1)  # [B]
    # Logits of classes a table does not have are masked so the model learns "answer among |Y|".
    absent = torch.arange(logits.shape[-1])[None, None, :] >= n_cls[:, None, None]
    logits = logits.masked_fill(absent, float("-inf"))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[:, n_context:].reshape(-1))


# ----------------------------------------------------------------------------------------- evaluation
def eval_tables() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_breast_cancer, load_iris, load_wine

    return {name: loader(return_X_y=True) for name, loader in
            (("breast_cancer", load_breast_cancer), ("wine", load_wine), ("iris", load_iris))}


def prepare_eval_features(x: np.ndarray, max_features: int = EVAL_FEATURES) -> np.ndarray:
    """Standardise once over the whole table and, past max_features, keep the leading PCA components."""
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler

    x = StandardScaler().fit_transform(x)
    if x.shape[1] > max_features:
        x = StandardScaler().fit_transform(PCA(n_components=max_features, random_state=0).fit_transform(x))
    return np.clip(x, -6, 6).astype(np.float32)


@torch.no_grad()
def icl_predict(model: PfnMini, x_ctx: np.ndarray, y_ctx: np.ndarray, x_query: np.ndarray, n_classes: int) -> np.ndarray:
    logits = model(torch.from_numpy(x_ctx)[None], torch.from_numpy(y_ctx).long()[None], torch.from_numpy(x_query)[None])
    return logits[0, :, :n_classes].argmax(-1).numpy()


def evaluate(model: PfnMini, seeds: tuple[int, ...] = (0,)) -> dict[str, float]:
    from sklearn.model_selection import train_test_split

    model.eval()
    scores = {}
    for name, (x, y) in eval_tables().items():
        x = prepare_eval_features(x)
        accs = []
        for seed in seeds:
            xa, xb, ya, yb = train_test_split(x, y, test_size=0.5, stratify=y, random_state=seed)
            accs.append(float((icl_predict(model, xa, ya, xb, int(y.max()) + 1) == yb).mean()))
        scores[name] = float(np.mean(accs))
    model.train()
    return scores


# ----------------------------------------------------------------------------------------- training
def package_versions() -> dict[str, str]:
    from iclmem.provenance import package_versions as versions

    return versions(("torch", "numpy", "tabicl", "scikit-learn", "xgboost-cpu"))


def export(model: PfnMini, workdir: Path, meta: dict) -> Path:
    from safetensors.torch import save_file

    WEIGHTS_DIR.mkdir(parents=True, exist_ok=True)
    target = WEIGHTS_DIR / "pfn_mini.safetensors"
    tensors = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(tensors, str(target), metadata={"config": json.dumps(model.config.to_dict())})
    write_text_atomic(WEIGHTS_DIR / "pfn_mini.json", json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return target


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir)
    pool = workdir / "pool"
    workdir.mkdir(parents=True, exist_ok=True)
    generator_proc = None
    if args.generators > 0:
        generator_proc = [
            subprocess.Popen([sys.executable, "-m", "trainables.models.pretrain_pfn_mini", "--role", "generate",
                              "--workdir", str(workdir), "--seed", str(args.seed * 1000 + i + len(list(pool.glob("batch_*.pt")))),
                              "--pool-size", str(args.pool_size)])
            for i in range(args.generators)
        ]
    config = PfnMiniConfig()
    torch.manual_seed(args.seed)
    model = PfnMini(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    state_path = workdir / "state.pt"
    step = 0
    if state_path.exists():
        # Early states stored the lr as a numpy scalar; allow exactly that type, nothing else.
        with torch.serialization.safe_globals([np._core.multiarray.scalar, np.dtype, type(np.dtype(np.float64))]):
            state = torch.load(state_path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        step = int(state["step"])
        print(f"resumed at step {step}", flush=True)
    curve = workdir / "curve.jsonl"
    t0, losses = time.time(), []
    try:
        while step < args.steps:
            while not (pool_files := sorted(pool.glob("batch_*.pt"))) and args.gmm_share < 1:
                time.sleep(1)
            warm = min(1.0, (step + 1) / args.warmup)
            decay = 0.5 * (1 + np.cos(np.pi * min(step / args.steps, 1.0)))
            for group in opt.param_groups:
                group["lr"] = float(args.lr * warm * (0.1 + 0.9 * decay))
            if float(torch.rand(1, generator=gen)) < args.gmm_share or not pool_files:
                x, y, length = gmm_batch(gen, args.batch_size, config.max_features, config.max_classes)
            else:
                x, y, length = pool_batch(pool_files, gen, config.max_features)
            loss = split_loss(model, x, y, length, gen)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(float(loss.detach()))
            step += 1
            if step % args.save_every == 0 or step == args.steps:
                acc = evaluate(model)
                record = {"step": step, "loss": float(np.mean(losses)), "pool_batches": len(pool_files),
                          "seconds": round(time.time() - t0, 1), **{f"acc_{k}": round(v, 4) for k, v in acc.items()}}
                losses = []
                with curve.open("a") as fh:
                    fh.write(json.dumps(record) + "\n")
                print(json.dumps(record), flush=True)
                state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                         "generator": gen.get_state(), "step": step}
                atomic_write(state_path, lambda tmp, state=state: torch.save(state, tmp), to_path=True)
    finally:
        for proc in generator_proc or []:
            proc.terminate()
    if args.export:
        final = evaluate(model, seeds=(0, 1, 2, 3, 4))
        meta = {
            "model": "pfn-mini", "config": config.to_dict(), "steps": step, "seed": args.seed,
            "command": " ".join(["python -m trainables.models.pretrain_pfn_mini"] + sys.argv[1:]),
            "prior": "tabicl.prior.PriorDataset mlp_scm/tree_scm (2:1) pool + Gaussian-cluster share "
                     f"{args.gmm_share}", "versions": package_versions(), "final_accuracy_5_seeds": final,
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        print("exported", export(model, workdir, meta), json.dumps(final), flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=["train", "generate"], default="train")
    p.add_argument("--workdir", default=".pretrain")
    p.add_argument("--steps", type=int, default=6000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--gmm-share", type=float, default=0.35)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--generators", type=int, default=1)
    p.add_argument("--pool-size", type=int, default=4000)
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--export", action="store_true")
    args = p.parse_args(argv)
    if args.role == "generate":
        generate_pool(Path(args.workdir) / "pool", args.seed, args.batch_size, args.pool_size)
    else:
        train(args)


if __name__ == "__main__":
    main()
