"""Shared helpers of the benchmark scripts: provenance, timing and the sections of ``benchmarks/RESULTS.md``.

Every script prints a markdown table and replaces (or appends) its own ``## <name>`` section of
RESULTS.md with ``write_section``; the section starts with the exact command that produced it, the date,
the machine and the package versions, so a figure can always be traced to a run.

The benchmark machines are shared (a test run or a pretraining job may hold the CPUs at the same time),
so the scripts report **ratios measured within one run**, both sides interleaved, and never assert an
absolute time.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as _md
import os
import platform
import re
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

RESULTS = REPO / "benchmarks" / "RESULTS.md"
RESULTS_TITLE = "# Benchmarks"
RESULTS_INTRO = (
    "Each section below was written by the script named in its first line (`python3 benchmarks/<script>.py`; "
    "rerun it to refresh that section only). The machines are shared, so the figures that matter are "
    "**ratios measured within one run** (both sides interleaved); absolute times are this machine's, "
    "under whatever else was running (load average given per section)."
)

PACKAGES = ("torch", "numba", "numpy", "pandas", "scikit-learn", "ray", "psutil")


# ------------------------------------------------------------------------------------------ provenance
def versions(extra: Iterable[str] = ()) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in (*PACKAGES, *extra):
        try:
            out[pkg] = _md.version(pkg)
        except _md.PackageNotFoundError:
            pass
    return out


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as typed from the repository root: ``python3 benchmarks/x.py --flag``."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve()
    try:
        script_text = str(script.relative_to(REPO))
    except ValueError:
        script_text = argv[0]
    return " ".join(["python3", script_text, *(shlex.quote(a) for a in argv[1:])])


def cpu_model() -> str:
    """The CPU's model name and widest vector extension, from /proc/cpuinfo (Linux), or ''.

    The shares of the matmul rate in RESULTS.md depend on the CPU (the same probe forward read 54-57% of
    it on one machine and 61-66% on another whose plain matmul ran at half the rate), so every section
    names it.
    """
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # pragma: no cover - not on Linux
        return ""
    name, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not name:
            name = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    vector = next((f for f in ("avx512f", "avx2", "avx", "sse4_2") if f in flags), "")
    return ", ".join(part for part in (name, vector.upper()) if part)


def machine() -> str:
    cpus = os.cpu_count()
    try:
        load = "load average {:.1f} / {:.1f} / {:.1f}".format(*os.getloadavg())
    except OSError:  # pragma: no cover - not on Linux
        load = "load average n/a"
    model = cpu_model()
    return f"{platform.machine()}{f' ({model})' if model else ''}, {cpus} CPU(s), {load}"


def provenance(argv: Sequence[str] | None = None, extra_packages: Iterable[str] = ()) -> str:
    """One markdown paragraph: command, date, machine, versions."""
    v = ", ".join(f"{k} {val}" for k, val in versions(extra_packages).items())
    now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return f"Command: `{command_line(argv)}` — {now}; {machine()} (at the end of the run); {v}."


# ------------------------------------------------------------------------------------------ RESULTS.md
_HEADER = re.compile(r"^## (.+?)\s*$")


def split_sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(preamble, [(section name, section text including its header line)])."""
    preamble: list[str] = []
    sections: list[tuple[str, list[str]]] = []
    in_fence = False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        match = None if in_fence else _HEADER.match(line.rstrip("\n"))
        if match:
            sections.append((match.group(1), [line]))
        elif sections:
            sections[-1][1].append(line)
        else:
            preamble.append(line)
    return "".join(preamble), [(name, "".join(lines)) for name, lines in sections]


def write_section(name: str, markdown: str, results: Path | None = None, argv: Sequence[str] | None = None,
                  extra_packages: Iterable[str] = (), with_provenance: bool = True) -> Path:
    """Replace the ``## name`` section of RESULTS.md (or append it), atomically.

    ``markdown`` is the body; a provenance line (command, date, machine, versions) goes first unless
    ``with_provenance`` is False (sections folded in from elsewhere carry their own).
    """
    results = Path(results or RESULTS)
    text = results.read_text(encoding="utf-8") if results.is_file() else f"{RESULTS_TITLE}\n\n{RESULTS_INTRO}\n\n"
    preamble, sections = split_sections(text)
    body = markdown.strip("\n")
    if with_provenance:
        body = provenance(argv, extra_packages) + "\n\n" + body
    block = f"## {name}\n\n{body}\n\n"
    replaced = False
    out = []
    for sec_name, sec_text in sections:
        if sec_name == name and not replaced:
            out.append(block)
            replaced = True
        elif sec_name != name:
            out.append(sec_text if sec_text.endswith("\n\n") else sec_text.rstrip("\n") + "\n\n")
    if not replaced:
        out.append(block)
    new = preamble if preamble.strip() else f"{RESULTS_TITLE}\n\n{RESULTS_INTRO}\n\n"
    new = new.rstrip("\n") + "\n\n" + "".join(out)
    fd, tmp = tempfile.mkstemp(dir=results.parent, prefix=".RESULTS.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(new.rstrip("\n") + "\n")
    os.replace(tmp, results)
    return results


# ------------------------------------------------------------------------------------------ tables
def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> str:
    """Markdown table; ``align`` one char per column, 'l' or 'r' (default: first left, rest right)."""
    header = list(header)
    align = align or ("l" + "r" * (len(header) - 1))
    sep = ["---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def fmt(value: float, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def verdict(ok: bool) -> str:
    return "met" if ok else "**NOT met**"


# ------------------------------------------------------------------------------------------ timing
def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def interleave(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Run every function once per round, alternating the order each round (A B, B A, ...), so a
    change of load during the run hits both sides alike. Returns the seconds of each run."""
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            seconds, _ = timed(fns[n])
            times[n].append(seconds)
    return times


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set once in this process
        pass


def publish(section: str, text: str, no_write: bool, argv: Sequence[str] | None) -> None:
    """Print a benchmark's markdown and, unless ``no_write``, replace its section of RESULTS.md."""
    print()
    print(text)
    if not no_write:
        print("wrote", write_section(section, text, argv=[sys.argv[0], *(argv if argv is not None else sys.argv[1:])]))


# ------------------------------------------------------------------------------------------ the machine's limit
def count_flops(fn: Callable[[], Any], module: Any = None) -> tuple[int, Any]:
    """(floating-point operations of ``fn``'s matrix products, its result), counted by torch's
    ``FlopCounterMode`` (matmuls, batched matmuls, linear layers, attention: 2 per multiply-add).
    Elementwise work (norms, activations, softmax) is not counted: the figure is the model's
    matrix arithmetic, the part a matmul rate bounds. ``module``'s parameters are frozen meanwhile
    (the counter's module tracker hooks tensors that require grad, which fails on views of
    parameters taken under ``no_grad`` inside TabICL)."""
    from torch.utils.flop_counter import FlopCounterMode

    params = [p for p in module.parameters() if p.requires_grad] if module is not None else []
    for p in params:
        p.requires_grad_(False)
    try:
        with FlopCounterMode(display=False) as counter:
            out = fn()
    finally:
        for p in params:
            p.requires_grad_(True)
    return int(counter.get_total_flops()), out


def matmul_rate(m: int, k: int, n: int, device: Any = "cpu", seconds: float = 0.5, batch: int = 1) -> float:
    """The machine's float32 matrix-product rate (FLOP/s) for ``[batch, m, k] @ [batch, k, n]`` at the
    current torch thread count (CUDA: TF32 off, as iclmem's float32 scores run): the median of timed
    repetitions after a warm-up, each repetition long enough to time."""
    import torch

    device = torch.device(device)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(batch, m, k, generator=generator).to(device)
    b = torch.randn(batch, k, n, generator=generator).to(device)
    flops = 2.0 * batch * m * k * n
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    try:
        torch.matmul(a, b)
        sync()
        reps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 5 or reps < 3:
            torch.matmul(a, b)
            reps += 1
        sync()
        per_call = (time.perf_counter() - start) / reps
        inner = max(1, int(seconds / 5 / max(per_call, 1e-9)))
        rates = []
        for _ in range(5):
            sync()
            start = time.perf_counter()
            for _ in range(inner):
                torch.matmul(a, b)
            sync()
            rates.append(flops * inner / (time.perf_counter() - start))
        return float(statistics.median(rates))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
