"""The cost of a trial fine-tuned by the package's own fine-tuner (recipe upstream) against iclmem's own loop,
on the same model, task, members, epochs and checkpoint schedule, measured in one run.

    python3 benchmarks/upstream_recipe.py [--task breast_cancer] [--q 64] [--context-size 128] [--epochs 20]
                                          [--no-write]

Both paths run as the Tune trainable runs them, without Ray: iclmem's ``Finetuner`` (one step on C' with the
members as queries per epoch, then the in-context metrics with C', a checkpoint folder at each scheduled epoch)
and ``UpstreamFinetuner`` (the package's ``fit``: its own chunking of the members, its validation on C' every
epoch, its checkpoint file every epoch; iclmem's utility as the package deploys the weights, a checkpoint folder
at each scheduled epoch). Per model: wall time per trial, the ratio, and the share of the recipe's time spent
in the deployed-utility metrics (one fit of the package's estimator per context). Models: tiny random TabPFN
v2 and TabICL (the test suite's), and a larger random TabPFN v2 (emsize 96, 4 layers); random weights, so
the numbers are the cost of the recipes, not of any released checkpoint.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, md_table, publish  # noqa: E402

SECTION = "Upstream recipes: cost of a trial through the package's fine-tuner against iclmem's loop"
TABICL_TINY = dict(embed_dim=16, col_num_blocks=1, col_nhead=2, col_num_inds=8, row_num_blocks=1, row_nhead=2,
                   row_num_cls=2, icl_num_blocks=1, icl_nhead=2, zero_init=False)
MODELS = {
    "tabpfn-v2 tiny (emsize 16, 1 layer)": ("tabpfn-v2", dict(weights="random", emsize=16, nlayers=1, nhead=2)),
    "tabpfn-v2 (emsize 96, 4 layers)": ("tabpfn-v2", dict(weights="random", emsize=96, nlayers=4, nhead=4)),
    "tabicl tiny (embed 16)": ("tabicl", dict(weights="random", **TABICL_TINY)),
}


def own_loop(spec, task) -> float:
    from trainables.finetune import Finetuner

    start = time.perf_counter()
    finetuner = Finetuner(spec, [task])
    schedule = set(spec.schedule())
    with tempfile.TemporaryDirectory() as tmp:
        while finetuner.epoch < spec.epochs:
            result = finetuner.run_epoch()
            if result.epoch in schedule:
                finetuner.save(Path(tmp) / f"e{result.epoch}", result.metrics)
    return time.perf_counter() - start


def recipe(spec, task) -> tuple[float, float, int]:
    """(seconds, of which in the deployed utility, epochs run)."""
    from trainables.upstream import UpstreamFinetuner

    start = time.perf_counter()
    finetuner = UpstreamFinetuner(spec, [task])
    schedule = set(spec.schedule())
    evaluate = finetuner.evaluate
    spent = [0.0]

    def timed() -> dict:
        t = time.perf_counter()
        out = evaluate()
        spent[0] += time.perf_counter() - t
        return out

    finetuner.evaluate = timed  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        def on_epoch(result, package_file, _end) -> None:
            if result.epoch in schedule:
                finetuner.save(Path(tmp) / f"e{result.epoch}", package_file, result.metrics)

        end = finetuner.run(on_epoch)
    return time.perf_counter() - start, spent[0], end.last_epoch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="breast_cancer")
    parser.add_argument("--q", type=int, default=64)
    parser.add_argument("--context-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    import torch

    from trainables.data import TaskSource, prepare_task
    from trainables.finetune import FinetuneSpec
    from trainables.models.extras import extra_is_installed

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)  # as a trial runs (resources.torch_threads default)
    task = prepare_task(TaskSource(args.task, "builtin"), seed=0, q=args.q, context_size=args.context_size)
    rows = []
    for label, (name, options) in MODELS.items():
        if not extra_is_installed(name):
            continue
        common = dict(model=name, lr=1e-4, epochs=args.epochs, checkpoint_epochs=(1, 2, 5, 10, 20), seed=0)
        own = own_loop(FinetuneSpec(model_options=options, **common), task)
        # early stopping off, so both run every epoch
        upstream_options = {**options, "recipe": "upstream", "n_estimators": 2,
                            "finetuner": {"early_stopping": False}}
        seconds, utility, epochs = recipe(FinetuneSpec(model_options=upstream_options, **common), task)
        rows.append([label, fmt(own, 2), fmt(seconds, 2), fmt(seconds / own, 1), f"{100 * utility / seconds:.0f}%",
                     str(epochs)])
    text = (f"`{args.task}`, Q = {args.q} members, C' of {args.context_size} rows, {args.epochs} epochs, "
            "checkpoints at 1, 2, 5, 10, 20, one torch thread, lr 1e-4; the package fine-tuners with early stopping "
            "off (so both run every epoch) and a 2-member ensemble. Seconds per trial (fine-tuning, per-epoch "
            "metrics, checkpoint folders), measured one after the other in one run.\n\n"
            + md_table(["model", "iclmem loop (s)", "package recipe (s)", "ratio", "recipe: deployed utility",
                        "epochs"], rows)
            + "\n\nThe recipe's extra cost is its validation on C' after every epoch (an ensemble fit and predict), "
              "its checkpoint file every epoch (weights and optimizer), and iclmem's utility as deployed (one fit "
              "of the package's estimator per context, the last column); the probe of a checkpoint costs the same "
              "on both paths (it scores the network).\n")
    publish(SECTION, text, args.no_write, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
