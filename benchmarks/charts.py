"""Charts of the benchmarks' results: portkit beside its peers as ratios, one bar per row.

    PYTHONPATH=. python benchmarks/charts.py RESULTS.json [-o CHART.svg]

Reads the JSON that bench.py (`--json`), models.py or train_zoo.py wrote and draws it with
matplotlib (the `bench` extra); the file's extension picks the format (.svg keeps its text as
text, .png). Each script also draws its chart itself at the end of a run (`--chart`).

- bench.py: portkit's rate over numpy's and over torch's per workload (right of 1 is faster).
- models.py: onnxruntime's time per call over portkit's per model, backend and batch (right of
  1 is faster), so every chart reads the same way round.
- train_zoo.py: torch's CPU time per step over portkit's, eager and `portkit.jit`, per
  workload and thread count (right of 1 is faster).
The x axis is logarithmic; a vertical line marks parity.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

Series = dict[str, list[float | None]]


def bars(title: str, labels: list[str], series: Series, path: str | Path) -> Path | None:
    """Horizontal bars of each series' ratio per label, grouped by label, on a log axis with
    parity (1x) marked; None (a peer that did not run) leaves its bar out. Returns the path,
    or None when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no chart (pip install matplotlib)")
        return None
    matplotlib.use("Agg")
    from matplotlib import pyplot, ticker

    pyplot.rcParams["svg.fonttype"] = "none"           # labels stay text in an SVG
    height = 0.8 / max(len(series), 1)
    figure, axes = pyplot.subplots(figsize=(8, 0.22 * len(labels) * len(series) + 1.6))
    for k, (name, values) in enumerate(series.items()):
        rows = [(i, v) for i, v in enumerate(values) if v is not None and v > 0]
        if rows:
            positions = [i + (k - (len(series) - 1) / 2) * height for i, _ in rows]
            drawn = axes.barh(positions, [v for _, v in rows], height=height, label=name)
            for (i, _), bar in zip(rows, drawn):
                bar.set_gid(f"bar {name}: {labels[i]}")    # an SVG element's id
    axes.set_yticks(range(len(labels)), labels)
    axes.invert_yaxis()                                 # the first row on top, as in the table
    axes.axvline(1.0, color="black", linewidth=0.8)
    axes.set_xscale("log")
    axes.xaxis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))
    axes.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    axes.xaxis.set_minor_formatter(ticker.NullFormatter())
    axes.set_xlabel("speed relative to the peer (x, log scale; right of the line is faster)")
    axes.set_title(title, fontsize=10)
    if len(series) > 1:
        axes.legend(fontsize=8, loc="best")
    figure.tight_layout()
    # no creation date in an SVG, so that a chart redrawn from the same figures is the same file
    figure.savefig(path, metadata={"Date": None} if str(path).endswith(".svg") else None)
    pyplot.close(figure)
    print(f"chart: {path}")
    return Path(path)


def bench_chart(results: dict, path: str | Path) -> Path | None:
    """bench.py's JSON: portkit / numpy and portkit / torch per workload (rates)."""
    rows = [r for r in results["results"] if r["unit"] != "x" and r["portkit"]]
    meta = results.get("meta", {})
    series: Series = {
        f"vs {peer}": [r["portkit"] / r[peer] if r.get(peer) else None for r in rows]
        for peer in ("numpy", "torch")}
    return bars(f"bench.py: portkit's rate over numpy's and torch's on {meta.get('device', '?')}",
                [r["workload"] for r in rows], series, path)


def zoo_chart(results: dict, path: str | Path) -> Path | None:
    """models.py's JSON: onnxruntime's ms per call over portkit's, per model, backend, batch."""
    rows = [r for r in results["rows"] if "error" not in r]
    labels = [f"{r['model']} {r['backend']} b{r['batch']}" for r in rows]
    series: Series = {"vs onnxruntime": [1 / r["ratio"] for r in rows],
                      "vs torch": [r["ms"]["torch"] / r["ms"]["portkit"]
                                   if r["ms"].get("torch") else None for r in rows]}
    return bars(f"inference zoo ({results.get('size', 'full')} size): peer's time per call "
                f"over portkit's; load {results['load'][0]:.1f}", labels, series, path)


def train_chart(results: dict, path: str | Path) -> Path | None:
    """train_zoo.py's JSON: torch's CPU time per step over portkit's, eager and jitted."""
    modes = [m for m in ("portkit", "portkit.jit")
             if any(r["mode"] == m for r in results["rows"])]
    cpu_ms = {(r["workload"], r["size"], r["threads"], r["mode"]): r["cpu_ms"]
              for r in results["rows"] if "error" not in r}
    keys = list(dict.fromkeys((r["workload"], r["size"], r["threads"]) for r in results["rows"]))
    ratio = {key + (m,): cpu_ms[key + ("torch",)] / cpu_ms[key + (m,)]
             for key in keys for m in modes
             if key + ("torch",) in cpu_ms and key + (m,) in cpu_ms}
    labels = [f"{w}{' (quick)' if s == 'quick' else ''}, {t or 'default'} thr."
              for w, s, t in keys]
    series: Series = {f"{m} vs torch": [ratio.get(k + (m,)) for k in keys] for m in modes}
    return bars(f"training steps on {results.get('device', 'cpu')}: torch's CPU time per step "
                f"over portkit's; load {results['load_start'][0]:.1f}", labels, series, path)


def draw(results: dict, path: str | Path) -> Path | None:
    """The chart for whichever benchmark wrote `results`."""
    if "results" in results:
        return bench_chart(results, path)
    rows = results.get("rows", [])
    if rows and "model" in rows[0]:
        return zoo_chart(results, path)
    if rows and "mode" in rows[0]:
        return train_chart(results, path)
    raise ValueError("not a JSON file that bench.py, models.py or train_zoo.py wrote")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", help="JSON written by bench.py, models.py or train_zoo.py")
    parser.add_argument("-o", "--output", help="default: the JSON's name with .svg")
    args = parser.parse_args(argv)
    output = args.output or str(Path(args.results).with_suffix(".svg"))
    return 0 if draw(json.loads(Path(args.results).read_text()), output) else 1


if __name__ == "__main__":
    sys.exit(main())
