"""Pretrain pfn-mini: ``python -m trainables.models.pretrain --model pfn-mini``, under its original name.

    python -m trainables.models.pretrain_pfn_mini --workdir .pretrain --steps 6000 --seed 0

The shipped weights' record (``weights/pfn_mini.json``) names this command; it runs the one pretraining
loop of :mod:`trainables.models.pretrain` with pfn-mini's settings, step for step as it did when the weights
were trained, and its record names this command. Every option of that module applies (``--model`` is
fixed to pfn-mini).
"""

from __future__ import annotations

from collections.abc import Sequence

# The evaluation helpers, under the names benchmarks/embedded_model.py imports from here.
from trainables.models.pretrain_eval import eval_tables, icl_predict, prepare_eval_features

PROGRAM = "python -m trainables.models.pretrain_pfn_mini"

__all__ = ["PROGRAM", "eval_tables", "icl_predict", "main", "prepare_eval_features"]


def main(argv: Sequence[str] | None = None) -> None:
    from trainables.models.pretrain import main as pretrain_main

    pretrain_main(argv, program=PROGRAM, model="pfn-mini")


if __name__ == "__main__":
    main()
