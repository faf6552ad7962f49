"""The report's section for a sweep's regime ``context``: one line per deployed-context audit (task, model, Q,
seed) with its verdict, whether it is trusted, the strongest attack's AUC and TPR at 1% and 0.1% FPR on the
deployed context (strongest: the highest TPR at 1% FPR, ties the higher AUC, as ``probes.attacks.context.audit_verdict``
chooses it), the attack with the highest AUC beside it, and the highest TPR at 1% FPR any attack reaches on the
never-in-context control.

Reads ``RUN_DIR/context_audits.parquet`` (``orchestrator.audits.context_audit.collect_sweep_audits``: public columns,
ids and metrics) and each audit's ``verdict.json``, both through the run folder's reader
(``orchestrator.runfolder.run_folder.RunFolder.context_audits`` and ``context_audit_verdict``); no row value is read.

* :func:`context_audits_table` -- that table (pure, from the two);
* :func:`context_audits_section_html` -- the section (empty string without audits);
* :func:`write_context_report` -- ``report.html`` of a sweep whose only regime is ``context``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from iclmem.atomic import write_text_atomic
from iclmem.runfolder import REPORT_FILE
from iclmem.vocab import ContextTarget
from orchestrator.report.page import page
from orchestrator.report.parts import html_table, paragraph, section_html
from orchestrator.runfolder.run_folder import RunFolder

__all__ = ["context_audits_section_html", "context_audits_table", "write_context_report"]


def context_audits_table(rows: pd.DataFrame, verdicts: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """One row per audit (``run_id``) of ``rows`` (every audit's rows, as ``context_audits.parquet``) whose
    verdict is in ``verdicts`` (run id -> ``verdict.json``)."""
    out = []
    for run_id, part in rows.groupby("run_id", sort=True):
        verdict = verdicts.get(str(run_id))
        if verdict is None:
            continue
        strongest = str(verdict.get("strongest_attack"))
        deployed = part[part["target"] == ContextTarget.DEPLOYED.value]
        best = deployed[deployed["attack"] == strongest]
        control = part[part["target"] == ContextTarget.CONTROL.value]
        # the attack a reader ranking by AUC would pick: shown beside the strongest (ranked by TPR at 1% FPR)
        by_auc = deployed.sort_values(["auc", "tpr_at_1pct"], ascending=False, kind="mergesort").head(1)
        first = part.iloc[0]
        out.append({"run_id": run_id, "task": first["task"], "model": first["model"], "q": int(first["q"]),
                    "seed": int(first["seed"]), "verdict": verdict.get("outcome"),
                    "trusted": bool(verdict.get("trusted")), "strongest_attack": strongest,
                    "auc": float(best["auc"].iloc[0]) if not best.empty else float("nan"),
                    "tpr_at_1pct": float(best["tpr_at_1pct"].iloc[0]) if not best.empty else float("nan"),
                    "tpr_at_0_1pct": float(best["tpr_at_0_1pct"].iloc[0]) if not best.empty else float("nan"),
                    "highest_auc_attack": str(by_auc["attack"].iloc[0]) if not by_auc.empty else "",
                    "highest_auc": float(by_auc["auc"].iloc[0]) if not by_auc.empty else float("nan"),
                    "highest_auc_tpr_at_1pct": float(by_auc["tpr_at_1pct"].iloc[0]) if not by_auc.empty
                    else float("nan"),
                    "control_max_tpr_at_1pct": float(control["tpr_at_1pct"].max()) if not control.empty
                    else float("nan"),
                    "heldout_accuracy": float(first["heldout_accuracy"]),
                    # probe.value_inference: each attack's verdict beside the membership one
                    **{f"{attack}_inference": ("found" if v.get("found") else "not found")
                       + ("" if v.get("trusted") else " (not trusted)")
                       for attack, v in (verdict.get("value_inference") or {}).items()}})
    return pd.DataFrame(out)


def _read(run_dir: Path) -> pd.DataFrame:
    """The table of :func:`context_audits_table` from the run folder (empty without context audits); a damaged
    table or verdict is a DataError naming the file."""
    folder = RunFolder(run_dir)
    rows = folder.context_audits()
    if rows is None:
        return pd.DataFrame()
    verdicts = {}
    for run_id in rows["run_id"].astype(str).unique():
        verdict = folder.context_audit_verdict(run_id)
        if verdict is not None:
            verdicts[run_id] = verdict
    return context_audits_table(rows, verdicts)


def context_audits_section_html(run_dir: str | Path) -> str:
    """The section for the run folder's context audits; empty without any."""
    run_dir = Path(run_dir)
    table = _read(run_dir)
    if table.empty:
        return ""
    shown = table.copy()
    for col in ("auc", "tpr_at_1pct", "tpr_at_0_1pct", "highest_auc", "highest_auc_tpr_at_1pct",
                "control_max_tpr_at_1pct", "heldout_accuracy"):
        shown[col] = shown[col].map(lambda v: f"{v:.3f}")
    shown["trusted"] = shown["trusted"].map(lambda v: "yes" if v else "NOT trusted")
    untrusted = int((~table["trusted"]).sum())
    note = (f"Regime context ({len(table)} audit(s)): each model deployed with Q rows of the task as its context, "
            "audited for which rows they were by five attacks with reference contexts (the same audit as `iclmem "
            "audit-context`; each one's folder is under context_audits/). A verdict is trusted only when the "
            "never-in-context control gets no_signal under every attack and the blind baseline holds; the last "
            "TPR column is the control's highest. The strongest attack is the one with the highest TPR at 1% FPR "
            "on the deployed context (ties: the higher AUC), not the one with the highest AUC: a leak of a few rows "
            "shows at a low false-positive rate before it moves the AUC. Its auc and tpr columns are that attack's; "
            "highest_auc_attack is the attack the AUC alone would pick, with its own AUC and TPR at 1%, so both "
            "rankings are shown."
            + (f" {untrusted} verdict(s) are NOT trusted: read their folders' reasons." if untrusted else ""))
    return section_html("Deployed-context audits", [paragraph(note), html_table(shown)], run_dir, None, "")


def write_context_report(run_dir: str | Path, title: str) -> Path:
    """``report.html`` for a sweep with no fine-tuned checkpoint (regime context only): the audits' section."""
    run_dir = Path(run_dir)
    body = context_audits_section_html(run_dir)
    return write_text_atomic(run_dir / REPORT_FILE, page(title, [f'<section id="context-audits">{body}</section>']))
