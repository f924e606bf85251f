"""Figures and the HTML page of a run's books, checked against hand-built ledgers and rendered
in a real headless browser (Debian's chromium)."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedvalue.analysis.run_summary import load_run
from fedvalue.run.ledger_tables import LedgerWriter
from fedvalue.schema import LedgerRow, RoundRow
from fedvalue.analysis.report import html_report, run_figures, value_matrix, write_figures
from simulations.cli.main import main

CLIENTS, ROUNDS, PER_ROUND = 6, 4, 3


def write_books(run_dir, *, flows: bool = True, seed: int = 0):
    """A ledger of 6 clients, 3 sampled per round; noisy clients 0 and 3; TracIn flows for all."""
    rng = np.random.default_rng(seed)
    writer = LedgerWriter(run_dir, config={"simulation": "test", "seed": seed})
    phi = np.full((ROUNDS, CLIENTS), np.nan)
    before = 0.2
    for t in range(1, ROUNDS + 1):
        sampled = rng.choice(CLIENTS, PER_ROUND, replace=False)
        rows = []
        for c in range(CLIENTS):
            noisy = c in (0, 3)
            if c in sampled:
                phi[t - 1, c] = rng.normal(-0.02 if noisy else 0.03, 0.01)
                for method, value in (("ads", phi[t - 1, c]), ("loo", phi[t - 1, c] / 2)):
                    rows.append({"round": t, "client_id": c, "method": method, "value": float(value), "stderr": 0.0,
                                 "num_examples": 10, "status": "ok", "noisy": noisy})
            if flows:
                status = "ok" if c in sampled else "idle"
                for method in ("tracin_inflow", "tracin_outflow", "tracin_self"):
                    rows.append({"round": t, "client_id": c, "method": method, "value": float(rng.normal()),
                                 "stderr": 0.0, "num_examples": 10, "status": status, "noisy": noisy})
        after = before + float(np.nansum(phi[t - 1]))
        writer.write_round(RoundRow(round=t, clients=" ".join(map(str, sampled)), num_clients=PER_ROUND,
                                    num_failed=0, utility_before=before, utility_after=after,
                                    utility_realized=after, num_evaluations=8, valuation_seconds=0.01,
                                    ads_method="ads-exact", efficiency_gap=0.0),
                           [LedgerRow.from_mapping(row) for row in rows])
        before = after
    return phi


def png_size(png: bytes) -> tuple[int, int]:
    return Image.open(io.BytesIO(png)).size


def test_value_matrix_and_figures_follow_the_ledger(tmp_path):
    phi = write_books(tmp_path)
    run = load_run(tmp_path)
    matrix = value_matrix(run, "ads")
    assert list(matrix.index) == list(range(1, ROUNDS + 1)) and list(matrix.columns) == [str(c) for c in range(CLIENTS)]
    np.testing.assert_array_equal(np.isnan(matrix.to_numpy()), np.isnan(phi))
    np.testing.assert_allclose(matrix.to_numpy(), phi, rtol=0, atol=1e-15)
    # The cumulative curve ends at each client's total of the per-client summary.
    totals = run.summary()["total_ads"]
    np.testing.assert_allclose(matrix.fillna(0).cumsum().iloc[-1], totals.reindex(matrix.columns).fillna(0))
    figures = run_figures(run)
    assert [f.name for f in figures] == ["cumulative_value.png", "value_heatmap.png", "detection.png", "flows.png",
                                         "utility.png"]
    assert all(png_size(f.png)[0] > 300 for f in figures)
    assert [f.png for f in run_figures(load_run(tmp_path))] == [f.png for f in figures]  # same books, same bytes


def test_runs_without_flows_get_no_flow_figure_and_plots_land_in_figures_dir(tmp_path):
    write_books(tmp_path, flows=False)
    paths = write_figures(tmp_path)
    assert sorted(p.name for p in paths) == ["cumulative_value.png", "detection.png", "utility.png",
                                             "value_heatmap.png"]
    assert all(p.parent == tmp_path / "figures" and p.stat().st_size > 1000 for p in paths)


def test_html_is_self_contained_with_every_figure_and_table(tmp_path):
    write_books(tmp_path)
    page = html_report(tmp_path).read_text(encoding="utf-8")
    sources = re.findall(r'<img[^>]* src="([^"]+)"', page)
    assert len(sources) == 5 and all(s.startswith("data:image/png;base64,") for s in sources)
    for source in sources:
        assert png_size(base64.b64decode(source.split(",", 1)[1]))[0] > 300
    assert not re.search(r'(src|href)="(http|file|/)', page)  # nothing fetched from outside the page
    assert page.count("<table") == 5  # run, detection, selection, per client, per round


def test_a_directory_of_tables_shows_its_csvs_figures_and_the_books_below_it(tmp_path):
    pd.DataFrame({"k": [1, 2], "accuracy": [0.5, 0.75]}).to_csv(tmp_path / "summary.csv", index=False)
    Image.new("RGB", (40, 30), "red").save(tmp_path / "figure2.png")
    write_books(tmp_path / "seed-0" / "rule", flows=False)
    page = html_report(tmp_path).read_text(encoding="utf-8")
    assert "summary.csv" in page and "0.75" in page and "Books of seed-0/rule" in page
    assert len(re.findall(r"<img ", page)) == 1 + 4
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="run_dir: expected a run directory .* holds none"):
        html_report(tmp_path / "empty")


def test_cli_report_writes_plots_and_html_and_names_bad_directories(tmp_path, capsys):
    write_books(tmp_path / "run")
    assert main(["report", str(tmp_path / "run"), "--plots", "--html"]) == 0
    out = capsys.readouterr().out
    assert "total_ads" in out and "figures/cumulative_value.png" in out and "report.html" in out
    assert (tmp_path / "run" / "report.html").exists() and (tmp_path / "run" / "figures" / "flows.png").exists()
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--html"]) == 2
    assert "run_dir: expected a run directory" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing"), "--plots"]) == 2
    assert "run_dir: expected a run directory (fedvalue run's or a ValuingStrategy's)" in capsys.readouterr().err


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--window-size=1200,2400", *args], capture_output=True, text=True, timeout=120,
                          check=True)


def ink(png_path) -> tuple[float, int]:
    """Share of non-white pixels and number of distinct colours of a screenshot."""
    pixels = np.asarray(Image.open(png_path).convert("RGB")).reshape(-1, 3)
    return float((pixels.min(axis=1) < 250).mean()), len(np.unique(pixels, axis=0))


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; .ci/run does)")
def test_html_report_renders_its_figures_and_tables_in_headless_chromium(tmp_path):
    write_books(tmp_path / "run")
    page = html_report(tmp_path / "run")
    # A copy of the page that records, once loaded, each image's decoded width and each table's rows.
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", """<script>
window.addEventListener('load', () => {
  document.body.setAttribute('data-images', [...document.images].map(i => i.complete ? i.naturalWidth : -1).join(','));
  document.body.setAttribute('data-rows', [...document.querySelectorAll('table')].map(t => t.rows.length).join(','));
});</script></body>"""), encoding="utf-8")
    dom = chromium("--virtual-time-budget=5000", "--dump-dom", probe.as_uri()).stdout
    widths = [int(w) for w in re.search(r'data-images="([^"]*)"', dom).group(1).split(",")]
    rows = [int(r) for r in re.search(r'data-rows="([^"]*)"', dom).group(1).split(",")]
    assert len(widths) == 5 and all(w > 300 for w in widths)  # every figure decoded
    # detection (a header row and ads, loo), selection (per round), per client (2 header rows), per round
    assert rows[1:] == [3, ROUNDS + 1, CLIENTS + 2, ROUNDS + 1]

    shot, blank = tmp_path / "report.png", tmp_path / "blank.png"
    chromium(f"--screenshot={shot}", page.as_uri())
    (tmp_path / "blank.html").write_text("<!DOCTYPE html><html><body></body></html>", encoding="utf-8")
    chromium(f"--screenshot={blank}", (tmp_path / "blank.html").as_uri())
    covered, colours = ink(shot)
    blank_covered, blank_colours = ink(blank)
    assert blank_covered == 0.0 and blank_colours == 1
    # Text alone is grey on white; the figures' lines and colour map bring many colours.
    assert covered > 0.02 and colours > 200, (covered, colours)


def write_many_clients(run_dir, *, clients: int = 1000, rounds: int = 4, per_round: int = 250):
    """Books of a large federation: half of the clients noisy (lower values on average)."""
    rng = np.random.default_rng(7)
    noisy = set(rng.choice(clients, clients // 2, replace=False).tolist())
    writer = LedgerWriter(run_dir, config={"simulation": "test"})
    for t in range(1, rounds + 1):
        sampled = rng.choice(clients, per_round, replace=False)
        rows = [{"round": t, "client_id": int(c), "method": "ads", "value": float(rng.normal(-0.5 if c in noisy
                 else 0.5, 1.0)), "stderr": 0.0, "num_examples": 10, "status": "ok", "noisy": bool(c in noisy)}
                for c in sampled]
        writer.write_round(RoundRow(round=t, clients=" ".join(map(str, sampled)), num_clients=per_round,
                                    num_failed=0, utility_before=0.1 * t, utility_after=0.1 * t + 0.1,
                                    utility_realized=0.1 * t + 0.1, num_evaluations=2 * per_round,
                                    valuation_seconds=0.1, ads_method="ads-mc", efficiency_gap=0.0),
                           [LedgerRow.from_mapping(row) for row in rows])


def test_figures_and_page_stay_readable_at_a_thousand_clients(tmp_path):
    write_many_clients(tmp_path)
    run = load_run(tmp_path)
    figures = {f.name: f for f in run_figures(run)}
    # The heat map shows the 20 highest and 20 lowest clients by total (and a gap), not 1000 columns.
    width, height = png_size(figures["value_heatmap.png"].png)
    assert width < 1500 and height < 800, (width, height)
    assert "the 20 highest and lowest of" in figures["value_heatmap.png"].caption
    assert "median and 10-90% band" in figures["cumulative_value.png"].caption
    assert all(png_size(f.png)[0] < 1500 for f in figures.values())
    page = html_report(tmp_path).read_text(encoding="utf-8")
    tables = re.findall(r"<table.*?</table>", page, flags=re.S)
    per_client = next(t for t in tables if "total_ads" in t)
    assert per_client.count("<tr") == 2 + 2 * 50 + 1  # two header rows, the 50 highest, a gap, the 50 lowest
    assert "the 50 highest and lowest of" in page
