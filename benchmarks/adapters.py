"""Forward and fine-tuning-step time of every model adapter at one fixed problem size.

    python3 benchmarks/adapters.py [--scale production|tiny|both] [--reps 3] [--threads N]
                                   [--out FILE]   (default: the "Adapter benchmark" section of benchmarks/RESULTS.md)

Problem: B=8 contexts of N=64 rows, M=16 queries, F=8 features, C=3 candidate labels (regressors: 3
candidate values). Weights are randomly initialised (no checkpoints are downloaded): ``production`` uses
each package's default architecture, i.e. the size of the released checkpoints (TabICL v2, TabPFN v2,
ConTextTab base, pfn-mini's shipped config); ``tiny`` the instances of tests/test_adapter_contract.py.
Forward = ``log_probs`` (or ``candidate_log_probs``) under ``torch.no_grad`` in eval mode; step =
train mode, forward, NLL, backward and one AdamW step. Median of ``--reps`` timed runs after one warm-up.
Adapters whose optional package is missing are listed as skipped. Prints a markdown table and writes it
to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

B, N, M, F, C = 8, 64, 16, 8, 3

TABICL_TINY = dict(embed_dim=16, col_num_blocks=1, col_nhead=2, col_num_inds=8, row_num_blocks=1, row_nhead=2,
                   row_num_cls=2, icl_num_blocks=1, icl_nhead=2, zero_init=False)
TABPFN_TINY = dict(emsize=16, nlayers=1, nhead=2)

# (row label, registered name, kind, build options) per scale.
CASES: dict[str, list[tuple[str, str, str, dict[str, Any]]]] = {
    "production": [
        ("pfn-mini", "pfn-mini", "classification", dict(weights="random")),
        ("tabicl (default arch.)", "tabicl", "classification", dict(weights="random")),
        ("tabicl regressor (default arch., native)", "tabicl", "regression", dict(weights="random", task="regression")),
        ("tabpfn-v2", "tabpfn-v2", "classification", dict(weights="random")),
        ("tabpfn-v2 regressor (native)", "tabpfn-v2", "regression", dict(weights="random", task="regression")),
        # ConTextTab runs one table per forward, so its cost is linear in B: time one table, report x B.
        ("contexttab (base)", "contexttab", "classification", dict(weights="random", model_size="base", _one_table=True)),
    ],
    "tiny": [
        ("pfn-mini (tiny)", "pfn-mini", "classification", dict(weights="random", d_model=16, n_layers=1, n_heads=2, d_ff=32)),
        ("tabicl (tiny)", "tabicl", "classification", dict(weights="random", **TABICL_TINY)),
        ("tabpfn-v2 (tiny)", "tabpfn-v2", "classification", dict(weights="random", **TABPFN_TINY)),
        ("contexttab (tiny)", "contexttab", "classification", dict(weights="random", model_size="tiny")),
    ],
}


def _data(seed: int = 0, batch: int = B) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "cx": torch.randn(batch, N, F, generator=g),
        "cy": torch.stack([torch.randperm(N, generator=g) % C for _ in range(batch)]),
        "qx": torch.randn(batch, M, F, generator=g),
        "qy": torch.randint(C, (batch, M), generator=g),
        "cyv": 10.0 + 3.0 * torch.randn(batch, N, generator=g),
        "candidates": torch.tensor([6.0, 10.0, 14.0]),
    }


def _timed(fn: Callable[[], Any], reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(name: str, kind: str, options: dict[str, Any], reps: int) -> tuple[float, float, int, str]:
    from trainables.models import build_model

    options = dict(options)
    one_table = options.pop("_one_table", False)
    torch.manual_seed(0)
    model = build_model(name, **options)
    d = _data(batch=1 if one_table else B)
    n_params = sum(p.numel() for p in model.trainable_parameters())

    def log_probs() -> torch.Tensor:
        if kind == "regression":
            return model.candidate_log_probs(d["cx"], d["cyv"], d["qx"], d["candidates"])
        return model.log_probs(d["cx"], d["cy"], d["qx"], C)

    def forward() -> None:
        model.module.eval()
        with torch.no_grad():
            log_probs()

    optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=1e-5)

    def step() -> None:
        model.module.train()
        optimizer.zero_grad()
        loss = torch.nn.functional.nll_loss(log_probs().reshape(-1, C), d["qy"].reshape(-1))
        loss.backward()
        optimizer.step()

    factor = B if one_table else 1
    note = f"timed on 1 table, x{B} (one table per forward)" if one_table else ""
    return factor * _timed(forward, reps), factor * _timed(step, reps), n_params, note


def _count(n: int) -> str:
    return f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n / 1e3:.1f} k"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=["production", "tiny", "both"], default="both")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--only", nargs="*", default=None, help="registered model names to run")
    parser.add_argument("--out", default=None, help="write the table to this file instead of RESULTS.md's section")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    import trainables.models  # noqa: F401
    import trainables.models.contexttab_adapter  # noqa: F401  (in case trainables.models does not import them)
    import trainables.models.tabicl_adapter  # noqa: F401
    import trainables.models.tabpfn_adapter  # noqa: F401
    from trainables.models.extras import extra_is_installed, extra_status

    scales = ["production", "tiny"] if args.scale == "both" else [args.scale]
    rows = []
    for scale in scales:
        for label, name, kind, options in CASES[scale]:
            if args.only and name not in args.only:
                continue
            if not extra_is_installed(name):
                rows.append(f"| {label} | {scale} | – | – | – | skipped: {extra_status(name)} |")
                print(rows[-1], flush=True)
                continue
            try:
                fwd, step, n_params, note = bench(name, kind, options, args.reps)
            except Exception as exc:  # a benchmark row, not a test: report and go on
                rows.append(f"| {label} | {scale} | – | – | – | failed: {type(exc).__name__}: {exc} |")
            else:
                rows.append(f"| {label} | {scale} | {_count(n_params)} | {fwd * 1e3:.1f} | {step * 1e3:.1f} | {note} |")
            print(rows[-1], flush=True)

    header = [
        "# Adapter benchmark",
        "",
        f"B={B} contexts x N={N} rows, M={M} queries, F={F} features, C={C} candidates; random init "
        f"(production = each package's default architecture, the size of its released checkpoints); median of {args.reps} runs after a warm-up.",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} intra-op threads, CPU float32"
        + (f"; load average {os.getloadavg()[0]:.1f} at the end (shared machine)" if hasattr(os, "getloadavg") else ""),
        "",
        "| adapter | scale | trainable params | forward (ms) | fine-tune step (ms) | note |",
        "|---|---|---:|---:|---:|---|",
    ]
    table = "\n".join(header + rows) + "\n"
    print()
    print(table)
    if args.out:
        Path(args.out).write_text(table)
    else:
        sys.path.insert(0, str(REPO / "benchmarks"))
        from _common import write_section

        write_section("Adapter benchmark", table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
