"""Books you can look at: figures and a self-contained HTML page of a run directory.

For a run with a ledger (``ledger.csv``, ``rounds.csv``):

``cumulative_value.png``
    Φ_i(t) = Σ_{s ≤ t} φ_s(i) per client over rounds (the valuation method ``ads``, else the
    first booked one), noisy clients dashed in red where the run knows them. Above
    :data:`MAX_CLIENT_LINES` clients: the median and 10–90% band of each group (noisy, clean).
``value_heatmap.png``
    φ_t(i) as a rounds × clients map (diverging, centred on 0; blank where a client was not
    valued), noisy clients' ids in red. Above :data:`MAX_HEATMAP_CLIENTS` clients: the
    :data:`EXTREME_CLIENTS` highest and lowest by Φ_i.
``detection.png`` (runs that know their noisy clients)
    ROC curve of "lower Φ_i = noisy" per method, and every client's Φ_i in rank order with the
    cut at K, the number of noisy clients (:mod:`fedvalue.analysis.findings`).
``flows.png`` (runs with TracIn flows)
    Each client's total inflow against its total outflow ([RECIP] Def. 2.1: reciprocal
    clients lie near the diagonal).
``utility.png``
    U(A_{t−1}), v_t(I_t) and the realized U(A_t) per round.

The HTML page adds the detection and selection tables of :mod:`fedvalue.analysis.findings`; its
per-client table shows the :data:`MAX_CLIENT_ROWS` highest and lowest clients of a large run.

A directory of tables (a study's, a figure reproduction's) has no ledger of its own: its
HTML page shows its CSV tables and PNG figures, and the books of every run directory below
it. Figures are written without a timestamp: the same books give the same PNG bytes.

A run directory may come from anyone: every file is read and written through
:mod:`fedvalue.run.rundir` (never through a link, regular files only: a linked report.html or
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

from fedvalue.run import rundir
from fedvalue.analysis.findings import Findings, findings_lines, run_findings
from fedvalue.analysis.run_summary import Run, load_run
from fedvalue.run.rundir import RunDir, open_run_dir, printable
from fedvalue.schema import (
    FIGURES_DIR,
    LEDGER_FILE,
    REPORT_FILE,
    RUN_CONFIG_FILE,
    VALUATION_METHODS,
    Status,
    client_sort_key,
)

__all__ = ["Figure", "html_report", "run_figures", "write_figures"]

HTML_FILE = REPORT_FILE
#: Rows of a directory's CSV table shown in its HTML page.
MAX_TABLE_ROWS = 200
#: Clients drawn one line each in the cumulative figure; above it, each group's median and band.
MAX_CLIENT_LINES = 30
#: Clients shown as heat-map columns; above it, the EXTREME_CLIENTS highest and lowest by total.
MAX_HEATMAP_CLIENTS = 40
EXTREME_CLIENTS = 20
#: Per-client rows of the HTML page: all up to twice this, else this many highest and lowest.
MAX_CLIENT_ROWS = 50
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
    rows = run.ledger[(run.ledger["method"] == method) & run.ledger["status"].isin([Status.OK, Status.IDLE])]
    matrix = rows.pivot_table(index="round", columns="client_id", values="value", aggfunc="sum")
    clients = sorted(matrix.columns, key=client_sort_key)
    rounds = sorted(set(run.rounds["round"]) | set(matrix.index)) if len(run.rounds) else list(matrix.index)
    return matrix.reindex(index=rounds, columns=clients)


def noisy_clients(run: Run) -> set[str]:
    """Client ids the ledger marks noisy."""
    marked = run.ledger[run.ledger["noisy"].fillna(False).astype(bool)]
    return set(marked["client_id"])


def _groups(clients: list, noisy: set[str]) -> dict[str, list]:
    """Clients by group: noisy and clean where the run knows them, else one group."""
    if not noisy:
        return {"all clients": clients}
    return {"noisy": [c for c in clients if c in noisy], "clean": [c for c in clients if c not in noisy]}


def _cumulative_figure(plt, cumulative: pd.DataFrame, method: str, noisy: set[str]) -> Figure:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    many = cumulative.shape[1] > MAX_CLIENT_LINES
    if many:  # a line per client would be a blot: each group's median and 10-90% band
        for name, members in _groups(list(cumulative.columns), noisy).items():
            if not members:
                continue
            values = cumulative[members].to_numpy(dtype=float)
            low, mid, high = np.percentile(values, [10, 50, 90], axis=1)
            color = _NOISY if name == "noisy" else _CLEAN
            ax.fill_between(cumulative.index, low, high, color=color, alpha=0.2)
            ax.plot(cumulative.index, mid, color=color, marker="o", markersize=3,
                    linestyle="--" if name == "noisy" else "-", label=f"{name} ({len(members)}): median, 10-90%")
        ax.legend(loc="best")
    else:
        for client in cumulative.columns:
            is_noisy = client in noisy
            ax.plot(cumulative.index, cumulative[client], color=_NOISY if is_noisy else _CLEAN,
                    linestyle="--" if is_noisy else "-", marker="o", markersize=3, linewidth=1, alpha=0.8)
        if noisy:
            ax.plot([], [], color=_NOISY, linestyle="--", label="noisy client")
            ax.plot([], [], color=_CLEAN, label="clean client")
            ax.legend(loc="best")
    ax.axhline(0.0, color="grey", linewidth=0.6)
    ax.set(xlabel="round", ylabel=f"cumulative {method} value", title=f"Cumulative {method} value per client")
    _integer_ticks(ax)
    caption = (f"Cumulative {method} value over rounds: median and 10-90% band of the "
               f"{cumulative.shape[1]} clients" + (" by group (noisy red, dashed)" if noisy else "") if many else
               f"Cumulative {method} value per client over rounds" + (" (noisy clients dashed, red)" if noisy else ""))
    return Figure("cumulative_value.png", caption, _png(fig))


def _heatmap_figure(plt, matrix: pd.DataFrame, method: str, noisy: set[str]) -> Figure:
    total = matrix.shape[1]
    shown = matrix
    if total > MAX_HEATMAP_CLIENTS:  # the highest and lowest by total, a blank column between
        order = matrix.sum(axis=0, min_count=1).fillna(0.0).sort_values(ascending=False, kind="mergesort").index
        top, bottom = list(order[:EXTREME_CLIENTS]), list(order[-EXTREME_CLIENTS:])
        shown = pd.concat([matrix[top], pd.DataFrame({"…": np.nan}, index=matrix.index), matrix[bottom]], axis=1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.28 * shown.shape[1] + 2), max(3.0, 0.35 * shown.shape[0] + 1.5)))
    values = shown.to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    bound = float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0
    image = ax.imshow(np.ma.masked_invalid(values), cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto",
                      interpolation="nearest")
    ax.set_xticks(range(shown.shape[1]), [client_label(c) for c in shown.columns], rotation=90, fontsize=7)
    ax.set_yticks(range(shown.shape[0]), [str(r) for r in shown.index])
    for client, label in zip(shown.columns, ax.get_xticklabels()):
        if client in noisy:
            label.set_color(_NOISY)
    which = f" (the {EXTREME_CLIENTS} highest and lowest of {total} by total)" if shown is not matrix else ""
    ax.set(xlabel="client" + which + (" (noisy in red)" if noisy else ""), ylabel="round",
           title=f"{method} value per round and client")
    fig.colorbar(image, ax=ax, label=f"{method} value")
    return Figure("value_heatmap.png", f"{method} value per round (rows) and client (columns){which}", _png(fig))


def roc_points(scores: np.ndarray, noisy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(false-positive rate, true-positive rate) of "score below a threshold = noisy" at every
    threshold, from (0, 0) to (1, 1); tied scores move both rates at once (a straight segment),
    so the area under the curve is :func:`fedvalue.analysis.detection.roc_auc`."""
    order = np.argsort(scores, kind="mergesort")
    scores, noisy = scores[order], noisy[order].astype(float)
    ends = np.r_[np.flatnonzero(scores[1:] != scores[:-1]), len(scores) - 1]
    true_positives = np.cumsum(noisy)[ends]
    false_positives = (ends + 1) - true_positives
    return (np.r_[0.0, false_positives / max(1.0, len(noisy) - noisy.sum())],
            np.r_[0.0, true_positives / max(1.0, noisy.sum())])


def _detection_figure(plt, run: Run, findings: Findings) -> Figure:
    fig, (roc, ranks) = plt.subplots(1, 2, figsize=(11, 4.5))
    count = int(findings.detection["n_noisy"].iloc[0])
    for row, style in zip(findings.detection.itertuples(), ("-", "--", ":")):
        valued = run.ledger[(run.ledger["method"] == row.method) & (run.ledger["status"] == Status.OK)]
        totals = valued.groupby("client_id")["value"].sum()
        flags = valued.groupby("client_id")["noisy"].first().astype(bool).reindex(totals.index)
        fpr, tpr = roc_points(totals.to_numpy(float), flags.to_numpy(bool))
        roc.plot(fpr, tpr, style, label=f"{row.method}: AUC {row.auc:.3f}")
        if row.Index == 0:  # the rank plot shows the first method (ads when booked)
            order = totals.sort_values(kind="mergesort")
            colors = [_NOISY if flags[c] else _CLEAN for c in order.index]
            ranks.scatter(np.arange(1, len(order) + 1), order.to_numpy(float), c=colors,
                          s=max(4.0, 40.0 - 0.04 * len(order)))
            ranks.axvline(count + 0.5, color="grey", linewidth=0.8)
            ranks.axhline(0.0, color="grey", linewidth=0.6)
            ranks.plot([], [], "o", color=_NOISY, label="noisy")
            ranks.plot([], [], "o", color=_CLEAN, label="clean")
            ranks.set(xlabel=f"client rank by total {row.method} (lowest first; line at K = {count})",
                      ylabel=f"total {row.method} value",
                      title=f"Precision at {count}: {row.precision_at_k:.3f} (share noisy left of the line)")
            ranks.legend(loc="best")
    roc.plot([0, 1], [0, 1], color="grey", linewidth=0.8, label="random: AUC 0.5")
    roc.set(xlabel="clean clients flagged (false-positive rate)", ylabel="noisy clients flagged (true-positive rate)",
            title="Detection: lower total value flagged first", xlim=(0, 1), ylim=(0, 1.02))
    roc.legend(loc="lower right")
    return Figure("detection.png", f"Detection of the {count} noisy clients from their booked values: ROC curve "
                                   "per method, and the clients ranked by total value", _png(fig))


def run_figures(run: Run, findings: Findings | None = None) -> list[Figure]:
    """The figures of a run (module docstring); figures whose data the run lacks are left out.
    ``findings``: the run's :func:`fedvalue.analysis.findings.run_findings`, when already computed."""
    plt = _pyplot()
    figures: list[Figure] = []
    method = value_method(run)
    noisy = noisy_clients(run)
    findings = run_findings(run) if findings is None else findings
    if method is not None:
        matrix = value_matrix(run, method)
        figures.append(_cumulative_figure(plt, matrix.fillna(0.0).cumsum(), method, noisy))
        figures.append(_heatmap_figure(plt, matrix, method, noisy))
    if findings.detection is not None:
        figures.append(_detection_figure(plt, run, findings))
    flows = run.flows()
    if not flows.empty:
        totals = flows.groupby("client")[["inflow", "outflow"]].sum()
        fig, ax = plt.subplots(figsize=(5.5, 5.5))
        colors = [_NOISY if c in noisy else _CLEAN for c in totals.index]
        ax.scatter(totals["outflow"], totals["inflow"], c=colors, s=max(4.0, 25.0 - 0.02 * len(totals)))
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


def _findings_tables(findings: Findings) -> list[str]:
    """The detection and selection tables (and their plain-text summary) of a run's page."""
    parts = []
    lines = findings_lines(findings)
    if lines:
        parts.append("<pre class='findings'>" + html.escape("\n".join(lines)) + "</pre>")
    if findings.detection is not None:
        parts.append(_table(findings.detection.rename(columns={"precision_at_k": "precision_at_K"}),
                            "Detection of the noisy clients (lower total value = more suspicious)", index=False))
    if findings.selection is not None and len(findings.selection):
        parts.append(_table(findings.selection, f"Top-{findings.k} selection by {findings.method} per round "
                                                "(kept: highest first)", index=False))
    return parts


def _client_rows(summary: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The per-client table, cut to the highest and lowest :data:`MAX_CLIENT_ROWS` of a large run."""
    if len(summary) <= 2 * MAX_CLIENT_ROWS:
        return summary, "Per client (sorted by value)"
    gap = pd.DataFrame(index=pd.Index(["…"], name=summary.index.name), columns=summary.columns)
    cut = pd.concat([summary.head(MAX_CLIENT_ROWS), gap, summary.tail(MAX_CLIENT_ROWS)])
    return cut, (f"Per client (sorted by value): the {MAX_CLIENT_ROWS} highest and lowest of {len(summary)}; "
                 "ledger.csv holds all")


def _run_section(run: RunDir, title: str) -> list[str]:
    books = load_run(run)
    findings = run_findings(books)
    summary = pd.DataFrame({"value": {k: v for k, v in books.run_summary().items()}})
    parts = [f"<section><h2>{html.escape(printable(title))}</h2>", _table(summary, "Run")]
    parts += _findings_tables(findings)
    parts += [_img(f.png, f.caption) for f in run_figures(books, findings)]
    clients, caption = _client_rows(books.summary())
    parts.append(_table(_printable_frame(clients), caption))
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
figure{margin:1em 0}img{max-width:100%}figcaption{font-size:13px;color:#444}
pre.findings{background:#f6f6f6;padding:0.6em;font-size:13px}"""


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
        raise FileNotFoundError(f"run_dir: expected a run directory (fedvalue run's or a ValuingStrategy's); {printable(directory)} is "
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
        raise FileNotFoundError(f"run_dir: expected a run directory (fedvalue run's or a ValuingStrategy's); {printable(directory)} is "
                                "none.") from None
    return [run] if run.exists(LEDGER_FILE) else [run.subdir(name) for name in _ledger_dirs(run)]
