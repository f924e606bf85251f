"""Books you can look at: figures and a self-contained HTML page of a run directory.

For a run with a ledger (``ledger.csv``, ``rounds.csv``):

``cumulative_value.png``
    Φ_i(t) = Σ_{s ≤ t} φ_s(i) per client over rounds (the valuation method ``ads``, else the
    first booked one), noisy clients dashed in red where the run knows them.
``value_heatmap.png``
    φ_t(i) as a rounds × clients map (diverging, centred on 0; blank where a client was not
    valued), noisy clients' ids in red.
``flows.png`` (runs with TracIn flows)
    Each client's total inflow against its total outflow ([RECIP] Def. 2.1: reciprocal
    clients lie near the diagonal).
``utility.png``
    U(A_{t−1}), v_t(I_t) and the realized U(A_t) per round.

A directory of tables (a study's, a figure reproduction's) has no ledger of its own: its
HTML page shows its CSV tables and PNG figures, and the books of every run directory below
it. Figures are written without a timestamp: the same books give the same PNG bytes.

A run directory may come from anyone: every file is read and written through
:mod:`fedvalue.rundir` (never through a link, regular files only: a linked report.html or
figures/ is replaced, not written through; a linked table is not shown), text from the
run (client ids, run.json) is shown with its control characters escaped, and client ids
are drawn as plain text (a ``$`` is not matplotlib's math).
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedvalue import rundir
from fedvalue.ledger import Run, load_run
from fedvalue.rundir import RunDir, open_run_dir, printable
from fedvalue.schema import (
    FIGURES_DIR,
    LEDGER_FILE,
    REPORT_FILE,
    RUN_CONFIG_FILE,
    STATUS_IDLE,
    STATUS_OK,
    VALUATION_METHODS,
    client_sort_key,
)

__all__ = ["Figure", "html_report", "run_figures", "write_figures"]

HTML_FILE = REPORT_FILE
#: Rows of a directory's CSV table shown in its HTML page.
MAX_TABLE_ROWS = 200
_NOISY, _CLEAN = "#c0392b", "#2c6fbb"


@dataclass(frozen=True)
class Figure:
    """One figure of a report: its file name, caption and PNG bytes."""

    name: str
    caption: str
    png: bytes


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, metadata={"Software": None}, bbox_inches="tight")
    _pyplot().close(figure)
    return buffer.getvalue()


def _integer_ticks(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def value_method(run: Run) -> str | None:
    """The valuation method the figures show: ``ads`` when booked, else the first booked one."""
    booked = set(run.ledger["method"])
    return next((m for m in VALUATION_METHODS if m in booked), None)


def value_matrix(run: Run, method: str) -> pd.DataFrame:
    """φ_t(i) as rounds × clients (NaN where client i was not valued in round t)."""
    rows = run.ledger[(run.ledger["method"] == method) & run.ledger["status"].isin([STATUS_OK, STATUS_IDLE])]
    matrix = rows.pivot_table(index="round", columns="client_id", values="value", aggfunc="sum")
    clients = sorted(matrix.columns, key=client_sort_key)
    rounds = sorted(set(run.rounds["round"]) | set(matrix.index)) if len(run.rounds) else list(matrix.index)
    return matrix.reindex(index=rounds, columns=clients)


def noisy_clients(run: Run) -> set[str]:
    """Client ids the ledger marks noisy."""
    marked = run.ledger[run.ledger["noisy"].fillna(False).astype(bool)]
    return set(marked["client_id"])


def run_figures(run: Run) -> list[Figure]:
    """The figures of a run (module docstring); figures whose data the run lacks are left out."""
    plt = _pyplot()
    figures: list[Figure] = []
    method = value_method(run)
    noisy = noisy_clients(run)
    if method is not None:
        matrix = value_matrix(run, method)
        cumulative = matrix.fillna(0.0).cumsum()
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for client in cumulative.columns:
            is_noisy = client in noisy
            ax.plot(cumulative.index, cumulative[client], color=_NOISY if is_noisy else _CLEAN,
                    linestyle="--" if is_noisy else "-", marker="o", markersize=3, linewidth=1, alpha=0.8)
        ax.axhline(0.0, color="grey", linewidth=0.6)
        if noisy:
            ax.plot([], [], color=_NOISY, linestyle="--", label="noisy client")
            ax.plot([], [], color=_CLEAN, label="clean client")
            ax.legend(loc="best")
        ax.set(xlabel="round", ylabel=f"cumulative {method} value", title=f"Cumulative {method} value per client")
        _integer_ticks(ax)
        figures.append(Figure("cumulative_value.png", f"Cumulative {method} value per client over rounds"
                              + (" (noisy clients dashed, red)" if noisy else ""), _png(fig)))

        fig, ax = plt.subplots(figsize=(max(6.0, 0.28 * matrix.shape[1] + 2), max(3.0, 0.35 * matrix.shape[0] + 1.5)))
        values = matrix.to_numpy(dtype=float)
        finite = values[np.isfinite(values)]
        bound = float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0
        image = ax.imshow(np.ma.masked_invalid(values), cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto",
                          interpolation="nearest")
        ax.set_xticks(range(matrix.shape[1]), [client_label(c) for c in matrix.columns], rotation=90, fontsize=7)
        ax.set_yticks(range(matrix.shape[0]), [str(r) for r in matrix.index])
        for client, label in zip(matrix.columns, ax.get_xticklabels()):
            if client in noisy:
                label.set_color(_NOISY)
        ax.set(xlabel="client" + (" (noisy in red)" if noisy else ""), ylabel="round",
               title=f"{method} value per round and client")
        fig.colorbar(image, ax=ax, label=f"{method} value")
        figures.append(Figure("value_heatmap.png", f"{method} value per round (rows) and client (columns)",
                              _png(fig)))
    flows = run.flows()
    if not flows.empty:
        totals = flows.groupby("client")[["inflow", "outflow"]].sum()
        fig, ax = plt.subplots(figsize=(5.5, 5.5))
        colors = [_NOISY if c in noisy else _CLEAN for c in totals.index]
        ax.scatter(totals["outflow"], totals["inflow"], c=colors, s=25)
        low = float(min(totals.min().min(), 0.0))
        high = float(max(totals.max().max(), 0.0))
        ax.plot([low, high], [low, high], color="grey", linewidth=0.8, label="inflow = outflow")
        ax.set(xlabel="total outflow (helped others)", ylabel="total inflow (helped by others)",
               title="TracIn inflow vs outflow per client")
        ax.legend(loc="best")
        figures.append(Figure("flows.png", "Total TracIn inflow against outflow per client" +
                              (" (noisy in red)" if noisy else ""), _png(fig)))
    if len(run.rounds):
        rounds = run.rounds
        fig, ax = plt.subplots(figsize=(7, 4))
        for column, label, style in (("utility_before", "U(A_{t-1}) = v_t(∅)", "o-"),
                                     ("utility_after", "v_t(I_t)", "s-"),
                                     ("utility_realized", "U(A_t), realized", "x--")):
            if rounds[column].notna().any():
                ax.plot(rounds["round"], rounds[column], style, label=label)
        _integer_ticks(ax)
        ax.set(xlabel="round", ylabel="utility", title="Utility per round")
        ax.legend(loc="best")
        figures.append(Figure("utility.png", "Utility before, with all replies and realized, per round", _png(fig)))
    return figures


def client_label(client_id) -> str:
    """A client id as a figure shows it: printable, and plain text (``$`` is not math)."""
    return printable(client_id, 40).replace("$", r"\$")


def write_figures(run_dir: str | Path | RunDir) -> list[Path]:
    """Write the run's figures to ``run_dir/figures/`` and return their paths (a link at
    figures/ or at a figure is refused or replaced, never written through)."""
    run = open_run_dir(run_dir)
    figures = run_figures(load_run(run))
    run.mkdir(FIGURES_DIR)
    paths = []
    for figure in figures:
        run.write_bytes(f"{FIGURES_DIR}/{figure.name}", figure.png)
        paths.append(run.path / FIGURES_DIR / figure.name)
    return paths


def _img(png: bytes, caption: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _table(frame: pd.DataFrame, caption: str, *, index: bool = True) -> str:
    body = frame.to_html(index=index, float_format=lambda v: f"{v:.4g}", na_rep="", border=0, classes="books")
    return f"<h3>{html.escape(caption)}</h3>{body}"


def _run_section(run: RunDir, title: str) -> list[str]:
    books = load_run(run)
    summary = pd.DataFrame({"value": {k: v for k, v in books.run_summary().items()}})
    parts = [f"<section><h2>{html.escape(printable(title))}</h2>", _table(summary, "Run")]
    parts += [_img(f.png, f.caption) for f in run_figures(books)]
    parts.append(_table(_printable_frame(books.summary()), "Per client (sorted by value)"))
    rounds = books.rounds.drop(columns=[c for c in ("hash",) if c in books.rounds])
    parts.append(_table(_printable_frame(rounds), "Per round", index=False))
    parts.append("</section>")
    return parts


def _printable_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its text (index and cells) shown with control characters escaped."""
    frame = frame.copy()
    frame.index = pd.Index([printable(i) if isinstance(i, str) else i for i in frame.index], name=frame.index.name)
    for column in frame.columns:
        if frame[column].dtype == object:
            frame[column] = frame[column].map(lambda v: printable(v) if isinstance(v, str) else v)
    return frame


def _ledger_dirs(run: RunDir) -> list[str]:
    """The run directories below ``run`` (relative names), found without following a link."""
    suffix = "/" + LEDGER_FILE
    return sorted(name[: -len(suffix)] for name, kind in run.walk().items()
                  if name.endswith(suffix) and kind == "a regular file")


_STYLE = """body{font-family:sans-serif;margin:2em;max-width:1200px}
table.books{border-collapse:collapse;font-size:12px;margin-bottom:1em}
table.books td,table.books th{border:1px solid #ccc;padding:2px 6px;text-align:right}
figure{margin:1em 0}img{max-width:100%}figcaption{font-size:13px;color:#444}"""


def html_report(directory: str | Path | RunDir, out: str | Path | None = None) -> Path:
    """Write one self-contained HTML page of ``directory`` (tables and figures inline, PNGs as
    base64 data) to ``out`` (default ``directory/report.html``) and return its path.

    A run directory gives its run summary, figures, per-client and per-round tables; any
    other directory its CSV tables (first :data:`MAX_TABLE_ROWS` rows), its PNG figures and
    the books of every run directory below it. Only regular files are shown: a link or
    special file is named as not shown.

    Raises
    ------
    FileNotFoundError
        ``directory`` does not exist or holds neither a ledger, a CSV table nor a figure.
    """
    try:
        run = open_run_dir(directory)
    except (FileNotFoundError, rundir.UnsafeRunFile):
        raise FileNotFoundError(f"run_dir: expected a directory written by fedvalue run; {printable(directory)} is "
                                "none.") from None
    config = run.read_json(RUN_CONFIG_FILE) if run.is_file(RUN_CONFIG_FILE) else {}
    name = printable(config.get("simulation", "run") if isinstance(config, dict) else "run", 200)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>fedvalue report: {html.escape(name)}"
             f"</title><style>{_STYLE}</style></head><body>",
             f"<h1>fedvalue report: {html.escape(name)}</h1><p>{html.escape(run.show())}</p>"]
    if run.exists(LEDGER_FILE):
        parts += _run_section(run, "Books")
    else:
        entries = {entry: run.kind(entry) for entry in run.listdir(".")}
        shown = [e for e, kind in entries.items() if e.endswith((".csv", ".png")) and kind == "a regular file"]
        hidden = [f"{printable(e)} ({kind})" for e, kind in entries.items()
                  if e.endswith((".csv", ".png")) and kind != "a regular file"]
        sub_runs = _ledger_dirs(run)
        if not (shown or sub_runs):
            raise FileNotFoundError(f"run_dir: expected a run directory (ledger.csv) or a directory of tables and "
                                    f"figures; {run.show()} holds none.")
        parts += [_img(run.read_bytes(e), printable(e)) for e in shown if e.endswith(".png")]
        for table in (e for e in shown if e.endswith(".csv")):
            frame = pd.read_csv(io.BytesIO(run.read_bytes(table)))
            more = f" (first {MAX_TABLE_ROWS} of {len(frame)} rows)" if len(frame) > MAX_TABLE_ROWS else ""
            parts.append(_table(_printable_frame(frame.head(MAX_TABLE_ROWS)), printable(table) + more, index=False))
        if hidden:
            parts.append(f"<p>Not shown (not regular files): {html.escape(', '.join(hidden))}</p>")
        for sub_run in sub_runs:
            with run.subdir(sub_run) as books:
                parts += _run_section(books, f"Books of {sub_run}")
    if config:
        parts.append(f"<h3>Configuration ({RUN_CONFIG_FILE})</h3><pre>"
                     f"{html.escape(json.dumps(config, indent=1, sort_keys=True, default=str))}</pre>")
    parts.append("</body></html>")
    page = "\n".join(parts)
    if out is None:
        run.write_text(HTML_FILE, page)
        return run.path / HTML_FILE
    out = rundir.resolve(out)
    RunDir(out.parent).write_text(out.name, page)
    return out


def figure_dirs(directory: str | Path | RunDir) -> Sequence[RunDir]:
    """The run directories whose figures ``--plots`` writes, opened: ``directory`` itself when
    it holds a ledger, else every run directory below it (found without following a link)."""
    try:
        run = open_run_dir(directory)
    except (FileNotFoundError, rundir.UnsafeRunFile):
        raise FileNotFoundError(f"run_dir: expected a directory written by fedvalue run; {printable(directory)} is "
                                "none.") from None
    return [run] if run.exists(LEDGER_FILE) else [run.subdir(name) for name in _ledger_dirs(run)]
