"""The results of a run: each row's medians and ratio, the results file
(bench-results/latest.json, with rows carried over from the previous one) and the table in
docs/benchmarks.md."""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

import orjson

from kbroker.bench.registry import KBROKER_OVER_BASELINE, Row, Scenario, load_scenarios

RESULTS_START = "<!-- results:start -->"
RESULTS_END = "<!-- results:end -->"


def _round(x: float | None) -> float | None:
    if x is None:
        return None
    return round(float(x), 2) if abs(x) >= 1 else float(f"{x:.4g}")


def _ratio(row: Row, k: float | None, b: float | None) -> float | None:
    if k is None or b is None:
        return None
    num, den = (k, b) if row.ratio == KBROKER_OVER_BASELINE else (b, k)
    return float(f"{num / den:.5g}") if den else None


def definition(row: Row) -> dict[str, Any]:
    """What a row's definition puts in its results: target, floor, the baseline's code."""
    return {
        "target": row.target,
        "floor": None if row.floor is None else str(row.floor),
        "baseline_code": row.baseline_code,
        "ratio_definition": row.ratio,
        "notes": row.notes,
    }


def summarise(row: Row, runs: list[dict]) -> dict:
    """The reported row: each side's median over the repetitions, their ratio, the run-to-run
    range of each side and of the per-repetition ratio, the target and the floor."""
    kb = [r["kbroker"] for r in runs if r.get("kbroker") is not None]
    bl = [r["baseline"] for r in runs if r.get("baseline") is not None]
    k = _round(statistics.median(kb)) if kb else None
    b = _round(statistics.median(bl)) if bl else None
    # Of the rounded figures, as the medians' ratio is: one repetition's range is then its ratio.
    ratios = [x for r in runs if (x := _ratio(row, _round(r.get("kbroker")), _round(r.get("baseline")))) is not None]
    out: dict[str, Any] = {
        "scenario": row.name,
        "unit": row.unit,
        "kbroker": k,
        "baseline": b,
        "ratio": _ratio(row, k, b),
        **definition(row),
        "met": None,
        "floor_held": None,
        "runs": runs,
        # Every row gives its run-to-run spread beside the medians (one repetition: [x, x]).
        "range": {
            side: [_round(min(v)), _round(max(v))] if v else None for side, v in (("kbroker", kb), ("baseline", bl))
        },
        "ratio_range": [min(ratios), max(ratios)] if ratios else None,
    }
    skipped = next((r["skipped_reason"] for r in runs if r.get("skipped_reason")), None)
    if skipped:
        out["skipped_reason"] = skipped
    # Details every repetition reports (latency percentiles, ...) get their median too.
    for side in ("kbroker", "baseline"):
        keys = {k2 for r in runs for k2 in (r.get(f"{side}_detail") or {})}
        detail = {}
        for key in sorted(keys):
            vals = [
                r[f"{side}_detail"][key]
                for r in runs
                if isinstance((r.get(f"{side}_detail") or {}).get(key), (int, float))
            ]
            if vals:
                detail[key] = _round(statistics.median(vals))
        if detail:
            out[f"{side}_detail"] = detail
    _judge(row, out)
    if row.finish is not None and runs:
        row.finish(out)
    return out


def skipped_rows(s: Scenario, reason: str, key: str = "skipped_reason") -> list[dict]:
    return [
        {
            "scenario": r.name,
            "unit": r.unit,
            "kbroker": None,
            "baseline": None,
            "ratio": None,
            **definition(r),
            "met": None,
            "floor_held": None,
            "runs": [],
            "range": None,
            "ratio_range": None,
            key: reason,
        }
        for r in s.rows
    ]


def merge_previous(doc: dict, previous: Path) -> dict:
    """Rows of scenarios this run did not measure are carried over from the previous results file
    (marked `carried_from` with that run's date and command), in registry order, so running some
    scenarios does not drop the others' latest figures."""
    try:
        old = orjson.loads(previous.read_bytes())
    except (OSError, ValueError):
        return doc
    rows = {row.name: row for s in load_scenarios().values() for row in s.rows}
    measured = {r["scenario"] for r in doc["results"]}
    by_name = {r["scenario"]: r for r in doc["results"]}
    for r in old.get("results") or []:
        if r.get("scenario") in measured or not isinstance(r, dict):
            continue
        by_name[r["scenario"]] = _redefine(
            {**r, "carried_from": r.get("carried_from") or {"date": old.get("date"), "command": old.get("command")}},
            rows,
        )
    order = list(rows)
    rank = {name: i for i, name in enumerate(order)}
    return {**doc, "results": sorted(by_name.values(), key=lambda r: rank.get(r["scenario"], len(order)))}


def _redefine(carried: dict, rows: dict[str, Row]) -> dict:
    """A carried-over row judged by today's definition of its row (a retired target is not
    printed again; met and floor_held recomputed), its figures untouched. Rows that no longer
    exist (or the derived TLS+SCRAM ones) are kept as they were."""
    row = rows.get(carried.get("scenario", ""))
    if row is None:
        return carried
    out = {**carried, **definition(row)}
    _judge(row, out)
    return out


def _judge(row: Row, out: dict) -> None:
    """A summarised row's `met` (its target) and `floor_held` (its floor), None where not measured."""
    measured = out.get("kbroker") is not None and out.get("baseline") is not None
    out["met"] = bool(row.check(out)) if measured and row.check is not None else None
    out["floor_held"] = row.floor.holds(out) if row.floor is not None else None


def write_results(doc: dict, out_dir: Path, name: str = "latest.json") -> Path:
    """OUT/latest.json (or OUT/`name`), written whole or not at all."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    tmp = out_dir / f"{name}.tmp"
    tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    os.replace(tmp, path)
    return path


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and abs(v) < 10:
        return f"{v:,.2f}"
    return f"{v:,.0f}"


def run_range(r: dict) -> str:
    """ "runs: kbroker a-b, baseline c-d" (each side's run-to-run range), "" when none ran."""
    ranges = r.get("range") or {}
    sides = [f"{side} {_fmt(v[0])}-{_fmt(v[1])}" for side in ("kbroker", "baseline") if (v := ranges.get(side))]
    if r.get("ratio_range"):
        lo, hi = r["ratio_range"]
        sides.append(f"ratio {lo:.2f}-{hi:.2f}")
    return f"runs: {', '.join(sides)}" if sides else ""


def results_markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = [
        f"Run {doc['date']} (`{doc['command']}`, {doc['params']['repeat']} repetitions, medians), "
        f"{doc['duration_s']:.0f} s.",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; {m['os']}; load average "
        f"(1, 5, 15 min) {', '.join(str(x) for x in m['load_average'])} at the start, "
        f"{', '.join(str(x) for x in m.get('load_average_end') or ['?'])} at the end. "
        f"{m['python']}; {m['kafka']}; "
        f"confluent-kafka {m['confluent_kafka']}; kbroker {m['kbroker']}.",
        "",
        *(
            [
                'Rows noted "from the run of ..." were not measured by this run: they are carried over '
                "from the previous results file (machine and parameters of that run).",
                "",
            ]
            if any(r.get("carried_from") for r in doc["results"])
            else []
        ),
        "| scenario | unit | kbroker | baseline | ratio | target | met | notes |",
        "| --- | --- | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for r in doc["results"]:
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.2f} ({r['ratio_definition']})"
        met = {True: "yes", False: "**no**", None: "-"}[r.get("met")]
        notes = r.get("error") and f"error: {r['error']}" or r.get("skipped_reason") or ""
        extra = r.get("summary") or ""
        spread = run_range(r)
        carried = r.get("carried_from")
        carried = f"from the run of {carried.get('date')}" if carried else ""
        notes = "; ".join(x for x in (carried, notes, extra, spread) if x)
        lines.append(
            f"| {r['scenario']} | {r['unit']} | {_fmt(r.get('kbroker'))} | "
            f"{_fmt(r.get('baseline'))} | {ratio} | {r.get('target') or '-'} | {met} | "
            f"{notes.replace('|', '/')} |"
        )
    return "\n".join(lines)


def update_docs(doc: dict, path: Path) -> None:
    """Rewrite what lies between the results markers of the Markdown file at `path`."""
    text = path.read_text()
    start, end = text.find(RESULTS_START), text.find(RESULTS_END)
    if start < 0 or end < start:
        raise ValueError(f"{path} has no '{RESULTS_START}' ... '{RESULTS_END}' section")
    new = text[: start + len(RESULTS_START)] + "\n" + results_markdown(doc) + "\n" + text[end:]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(new)
    os.replace(tmp, path)
