"""Which runs leaked: the fine-tuned runs with a memorization verdict at their headline checkpoint, and those
flagged through the known context C' only, as tables, as plain lines for the terminal (the last lines of
``iclmem run`` and ``iclmem report``) and as the report's first section."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from iclmem.record import RUN_KEY
from orchestrator.report.overview import outcome_summary
from orchestrator.report.page import df_to_html, fmt_value, tpr_1pct_display
from orchestrator.report.selection import DETECTABLE, fine_tuned_rows, peak_checkpoints
from probes.metrics import allowed_false_positives

__all__ = ["LEAKED_COLUMNS", "leaked_runs", "known_context_only_runs", "leaked_lines", "leaked_html"]

LEAKED_COLUMNS: tuple[str, ...] = ("run_id", "task", "model", "q", "lr", "label_mode", "seed", "epoch", "score_kind",
                                   "auc", "auc_low", "auc_high", "tpr_at_1pct", "n_nonmembers")


def leaked_runs(results: pd.DataFrame) -> pd.DataFrame:
    """The fine-tuned runs whose headline checkpoint (the peak, as the summary counts them) has a memorization
    verdict, one row each: run id, the checkpoint's epoch, its AUC (deciding kind) with the 95% interval, TPR at
    1% FPR and the non-members it rests on; highest AUC first. Every regime, as the outcome counts."""
    peaks = peak_checkpoints(fine_tuned_rows(results), regime=None)
    if peaks.empty or "outcome" not in peaks.columns:
        return pd.DataFrame(columns=list(LEAKED_COLUMNS))
    leaked = peaks[peaks["outcome"].astype(str) == DETECTABLE]
    cols = [c for c in LEAKED_COLUMNS if c in leaked.columns]
    order = [c for c in ("auc", *RUN_KEY) if c in leaked.columns]
    return (leaked.loc[:, cols].sort_values(order, ascending=[c != "auc" for c in order], kind="mergesort")
            .reset_index(drop=True))


DEPLOYED = "deployed_"  # the known-context channel scored as the package deploys the weights (recipe upstream)


def known_context_only_runs(results: pd.DataFrame, leaked: pd.DataFrame | None = None) -> pd.DataFrame:
    """The fine-tuned runs the zero-information verdict did not call memorization at their headline checkpoint
    but whose known-context channel flagged a checkpoint (``known_context_memorization_flag``: the same rule on
    the base-calibrated loss with C' as context, docs/METHOD.md "Where the zero-information probe is blind"; for
    recipe upstream also ``deployed_known_context_memorization_flag``, the same on the package's deployed
    classifier), one row each at the flagged checkpoint of highest known-context AUC: run id, task, epoch, that
    AUC with its interval and TPR at 10% FPR, and ``channel`` (``network``, or ``deployed`` when only the
    deployed classifier's channel flagged it: the AUC columns are then that channel's); highest AUC first.
    Empty when the results have no such column. ``leaked``: the results' :func:`leaked_runs`, when the caller
    has them already."""
    metrics = ["known_context_calibrated_auc", "known_context_calibrated_auc_low", "known_context_calibrated_auc_high",
               "known_context_calibrated_tpr_at_10pct"]
    columns = ["run_id", "task", "model", "epoch", *metrics, "channel"]
    ft = fine_tuned_rows(results)
    if ft.empty or "known_context_memorization_flag" not in ft.columns:
        return pd.DataFrame(columns=columns)
    network = ft["known_context_memorization_flag"].eq(True)
    deployed_flag = DEPLOYED + "known_context_memorization_flag"
    deployed = (ft[deployed_flag].eq(True) & ~network if deployed_flag in ft.columns
                else pd.Series(False, index=ft.index))
    views = [ft[network].assign(channel="network")]
    if deployed.any():
        view = ft[deployed].copy()
        for c in metrics:
            view[c] = view.get(DEPLOYED + c, float("nan"))
        views.append(view.assign(channel="deployed"))
    flagged = pd.concat(views)
    leaked = leaked_runs(results) if leaked is None else leaked
    flagged = flagged[~flagged["run_id"].isin(set(leaked["run_id"]))]
    if flagged.empty:
        return pd.DataFrame(columns=columns)
    best = (flagged.sort_values(["known_context_calibrated_auc", "epoch"], ascending=[False, True], kind="mergesort")
            .drop_duplicates("run_id"))
    return best.loc[:, [c for c in columns if c in best.columns]].reset_index(drop=True)


def _where(r: Mapping[str, Any]) -> str:
    """" [task, model]" of a leaked run's line: a run id does not name its model."""
    named = [str(r[k]) for k in ("task", "model") if k in r and pd.notna(r[k])]
    return f" [{', '.join(named)}]" if named else ""


def _known_context_text(r: Mapping[str, Any]) -> str:
    channel = " (as the package deploys the weights)" if r.get("channel") == "deployed" else ""
    return (f"epoch {int(r['epoch'])}, known-context AUC{channel} "
            f"{fmt_value('auc', r.get('known_context_calibrated_auc'))} "
            f"[{fmt_value('auc', r.get('known_context_calibrated_auc_low'))}, "
            f"{fmt_value('auc', r.get('known_context_calibrated_auc_high'))}]")


def leaked_lines(results: pd.DataFrame, limit: int = 20) -> list[str]:
    """The leaked runs as plain lines, for a terminal summary (what the report's first section shows)."""
    table = leaked_runs(results)
    _, n_runs = outcome_summary(results)
    if table.empty:
        return [f"No run leaked: none of the {n_runs} fine-tuned runs has a memorization verdict at its headline "
                "checkpoint."] + _known_context_lines(results, table, limit)
    lines = [f"{len(table)} of {n_runs} runs leaked (memorization at the headline checkpoint):"]
    for r in table.head(limit).to_dict("records"):
        lines.append(f"  {r['run_id']}{_where(r)}: epoch {int(r['epoch'])}, "
                     f"AUC {fmt_value('auc', r.get('auc'))} [{fmt_value('auc', r.get('auc_low'))}, "
                     f"{fmt_value('auc', r.get('auc_high'))}], TPR@1% {fmt_value('tpr_at_1pct', r.get('tpr_at_1pct'))}"
                     + (" (0 FP allowed)" if pd.notna(r.get("n_nonmembers"))
                        and allowed_false_positives(0.01, int(r["n_nonmembers"])) == 0 else ""))
    if len(table) > limit:
        lines.append(f"  ... and {len(table) - limit} more (report.html, section 'Runs that leaked')")
    return lines + _known_context_lines(results, table, limit)


def _known_context_lines(results: pd.DataFrame, leaked: pd.DataFrame, limit: int) -> list[str]:
    table = known_context_only_runs(results, leaked)
    if table.empty:
        return []
    more = "more " if not leaked.empty else ""
    lines = [f"{len(table)} {more}run{'s' if len(table) != 1 else ''} flagged through the known context C' only "
             "(known_context_memorization_flag; the zero-information probe did not find it; whether a flag holds on "
             "rounded outputs and how often null data raise it: the claim ledger, claims.parquet):"]
    for r in table.head(limit).to_dict("records"):
        lines.append(f"  {r['run_id']}{_where(r)}: {_known_context_text(r)}")
    if len(table) > limit:
        lines.append(f"  ... and {len(table) - limit} more (report.html, section 'Runs that leaked')")
    return lines


def leaked_html(results: pd.DataFrame) -> str:
    """The report's first section: which runs leaked, at which epoch, how strongly (AUC with its interval, TPR at
    1% FPR), before the outcome counts and the rule."""
    table = leaked_runs(results)
    _, n_runs = outcome_summary(results)
    if table.empty:
        body = (f"<p class=\"verdict\"><b>No run leaked:</b> none of the {n_runs} fine-tuned run"
                f"{'s' if n_runs != 1 else ''} has a memorization verdict at its headline checkpoint.</p>")
    else:
        shown = pd.DataFrame({
            "run_id": table["run_id"],
            **({"task": table["task"]} if "task" in table.columns else {}),
            "epoch": table["epoch"].astype(int),
            "AUC [95% interval]": [f"{fmt_value('auc', a)} [{fmt_value('auc', lo)}, {fmt_value('auc', hi)}]"
                                   for a, lo, hi in zip(table["auc"], table.get("auc_low", table["auc"]),
                                                        table.get("auc_high", table["auc"]))],
            "TPR@1%": tpr_1pct_display(table)["tpr_at_1pct"] if "tpr_at_1pct" in table.columns else "",
            **({"score_kind": table["score_kind"]} if "score_kind" in table.columns else {}),
        })
        body = (f"<p class=\"verdict\"><b>{len(table)} of {n_runs} run{'s' if n_runs != 1 else ''} leaked</b> "
                "(memorization verdict at the headline checkpoint: the highest calibrated AUC over epochs and score "
                "kinds). Highest AUC first; AUC and TPR@1% are the deciding score kind's.</p>" + df_to_html(shown))
    known = known_context_only_runs(results, table)
    if not known.empty:
        shown = pd.DataFrame({
            "run_id": known["run_id"], **({"task": known["task"]} if "task" in known.columns else {}),
            "epoch": known["epoch"].astype(int),
            **({"channel": known["channel"]} if (known["channel"] == "deployed").any() else {}),
            "known-context AUC [95% interval]": [
                f"{fmt_value('auc', a)} [{fmt_value('auc', lo)}, {fmt_value('auc', hi)}]"
                for a, lo, hi in zip(known["known_context_calibrated_auc"], known["known_context_calibrated_auc_low"],
                                     known["known_context_calibrated_auc_high"])]})
        body += (f"<p class=\"verdict\"><b>{len(known)} more run{'s' if len(known) != 1 else ''} flagged through "
                 "the known context C′ only:</b> the zero-information probe did not call memorization, but the same "
                 "rule on the base-calibrated loss with C′ as the context did (<code>known_context_memorization_flag"
                 "</code>; METHOD.md, \"Where the zero-information probe is blind\"). Whether whoever holds C′ can "
                 "tell these members from rounded outputs, and how often null data raise the flag, is in the claim "
                 "ledger above (\"What this audit claims\").</p>" + df_to_html(shown))
    return f'<section id="leaked"><h2>Runs that leaked</h2>{body}</section>'
