"""What a person reads: PNG charts, one report.html, and a one-screen text summary.

All from the summary dict the job writes as summary.json (no Spark here), so a report
can be rebuilt from an old summary: `python -m spark.report OUT/summary.json`.
"""
from __future__ import annotations

import html
import json
import os
import sys

CHARTS = ("usage_histogram.png", "reclaimable_per_bookie.png", "what_if.png")


def human(n: float) -> str:
    n = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def _unit(max_bytes: float) -> tuple[float, str]:
    """(divisor, name) so the largest value on a chart reads between 1 and 1000."""
    for div, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if max_bytes >= div:
            return div, name
    return 1.0, "bytes"


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


# ---------------------------------------------------------------- charts
def charts(summary: dict, out_dir: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    bookies = [b["bookie_id"] for b in summary["bookies"]]
    many = len(bookies) > 12
    # 1. usage histogram per bookie: closed logs by usage, one line per bookie (a heat map when many)
    hist = summary["usage_histogram"]
    bins = hist["bins"]
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=100)
    if many:
        grid = [hist["per_bookie"].get(b, [0] * bins) for b in bookies]
        im = ax.imshow(grid, aspect="auto", cmap="viridis", extent=(0, 1, len(bookies), 0))
        fig.colorbar(im, ax=ax, label="entry logs")
        ax.set_ylabel(f"bookie (1..{len(bookies)})")
    else:  # side-by-side bars per usage bin, one colour per bookie
        width = 1.0 / bins / max(1, len(bookies))
        for j, b in enumerate(bookies):
            ax.bar([i / bins + j * width for i in range(bins)], hist["per_bookie"].get(b, [0] * bins),
                   width=width, align="edge", label=b)
        ax.set_xlim(0, 1)
        ax.yaxis.get_major_locator().set_params(integer=True)  # counts of logs
        ax.set_ylabel("entry logs")
        ax.legend(fontsize=7, ncol=2)
    ax.axvline(summary["plan"]["threshold"], color="red", ls="--", lw=1, label="plan threshold")
    ax.set_xlabel("usage (live bytes / total bytes) of closed entry logs")
    ax.set_title("Entry-log usage per bookie")
    paths.append(_save(fig, out_dir, CHARTS[0]))
    # 2. live / reclaimable bytes per bookie (stacked)
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=100)
    x = range(len(bookies))
    div, unit = _unit(max([b["total_bytes"] for b in summary["bookies"]] + [1]))
    live = [b["live_bytes"] / div for b in summary["bookies"]]
    rec = [b["reclaimable_bytes"] / div for b in summary["bookies"]]
    ax.bar(x, live, color="#4c72b0", label="live")
    ax.bar(x, rec, bottom=live, color="#dd8452", label="reclaimable (deleted ledgers)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(bookies if not many else [str(i + 1) for i in x], rotation=60 if not many else 0,
                       fontsize=7, ha="right" if not many else "center")
    ax.set_ylabel(unit)
    ax.set_title("Bytes per bookie: live and reclaimable")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir, CHARTS[1]))
    # 3. what-if: reclaimed and rewritten against the threshold
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=100)
    total = summary["what_if"]["total"]
    ts = [r["threshold"] for r in total]
    div, unit = _unit(max([max(r["bytes_reclaimed"], r["bytes_rewritten"]) for r in total] + [1]))
    ax.plot(ts, [r["bytes_reclaimed"] / div for r in total], marker="o", label="bytes reclaimed")
    ax.plot(ts, [r["bytes_rewritten"] / div for r in total], marker="s", label="bytes rewritten")
    ax.axvline(summary["what_if"]["recommended_threshold"], color="green", ls=":", label="recommended")
    ax.axvline(summary["plan"]["threshold"], color="red", ls="--", lw=1, label="plan threshold")
    ax.set_xlabel("compaction threshold")
    ax.set_ylabel(f"{unit} (all bookies)")
    ax.set_title("What a compaction would free and cost")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir, CHARTS[2]))
    return paths


def _save(fig, out_dir: str, name: str) -> str:
    import matplotlib.pyplot as plt
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- HTML
def _table(rows: list[dict], cols: list[tuple[str, str]], limit: int = 50) -> str:
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title in cols)
    body = []
    for r in rows[:limit]:
        cells = []
        for key, _ in cols:
            v = r.get(key)
            if isinstance(v, float):
                text = f"{v:.3f}"
            elif isinstance(v, int) and not isinstance(v, bool) and key.endswith("bytes"):
                text = human(v)
            else:
                text = "" if v is None else str(v)
            cls = ' class="num"' if isinstance(v, (int, float)) and not isinstance(v, bool) else ""
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f'<p class="more">{len(rows) - limit} more rows in summary.json and the Parquet tables.</p>' \
        if len(rows) > limit else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}"


def _unreadable_html(summary: dict) -> str:
    u = summary.get("unreadable") or {}
    if not u.get("count"):
        return ""
    what = ("accepted by --allow-unreadable" if u.get("allowed") else "the run FAILED (exit status 1)")
    return (f'<div class="unreadable"><b>{u["count"]} entry log(s) could not be read</b>: no figure on this page '
            f"includes their bytes; {html.escape(what)}.</div>"
            + _table(u["logs"], [("bookie_id", "bookie"), ("log_id", "log"), ("error", "error")], 20))


def _unreadable_lines(summary: dict) -> list[str]:
    u = summary.get("unreadable") or {}
    if not u.get("count"):
        return []
    how = "allowed (--allow-unreadable)" if u.get("allowed") else "ERROR"
    lines = [f"  UNREADABLE: {u['count']} entry log(s), their bytes in no figure: {how}"]
    for r in u["logs"][:5]:
        lines.append(f"    {r['bookie_id']} log {r['log_id']}: {r['error']}")
    return lines


def write_html(summary: dict, out_dir: str) -> str:
    t = summary["totals"]
    p = summary["plan"]
    space = summary["space"]
    cards = [("Total", human(t["total_bytes"])), ("Live", human(t["live_bytes"])),
             ("Reclaimable", f'{human(t["reclaimable_bytes"])} ({_pct(t["reclaimable_bytes"], t["total_bytes"])})'),
             ("Plan frees", human(p["bytes_reclaimed"])), ("Plan rewrites", human(p["bytes_rewritten"])),
             ("Over-replicated", human(space["over_replicated_bytes"])),
             ("Under-replicated segments", str(space["under_replicated_count"]))]
    card_html = "".join(f'<div class="card"><div class="k">{html.escape(k)}</div><div class="v">{html.escape(v)}</div>'
                        f"</div>" for k, v in cards)
    run = summary["run"]
    scan = ""
    if summary.get("scan"):
        scan = "<h2>Full scan: entries and checksums</h2>" + _table(summary["scan"], [
            ("bookie_id", "bookie"), ("entries", "entries"), ("entry_bytes", "bytes"),
            ("checksum_failures", "checksum failures"), ("unchecked_entries", "not checkable"),
            ("bad_tails", "torn/garbage tails"), ("bad_tail_bytes", "tail bytes")])
    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>bk storage: GC analysis {html.escape(run["run_id"])}</title>
<style>
body {{ font-family: DejaVu Sans, Arial, sans-serif; margin: 24px; color: #222; max-width: 1100px; }}
h1 {{ font-size: 22px; margin-bottom: 4px; }} h2 {{ font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }}
.meta {{ color: #666; font-size: 12px; }}
.cards {{ display: flex; flex-wrap: wrap; gap: 10px; margin: 16px 0; }}
.card {{ background: #f4f6fa; border: 1px solid #dde3ee; border-radius: 6px; padding: 8px 14px; min-width: 120px; }}
.card .k {{ font-size: 11px; color: #666; text-transform: uppercase; }} .card .v {{ font-size: 18px; font-weight: bold; }}
table {{ border-collapse: collapse; font-size: 12px; margin: 8px 0; }}
th, td {{ border: 1px solid #ddd; padding: 3px 8px; text-align: left; }} th {{ background: #f0f0f0; }}
td.num {{ text-align: right; font-variant-numeric: tabular-nums; }} .more {{ color: #666; font-size: 12px; }}
img {{ max-width: 100%; border: 1px solid #eee; margin: 6px 0; }}
.unreadable {{ background: #fde8e8; border: 1px solid #e0a0a0; border-radius: 6px; padding: 8px 14px; margin: 12px 0; }}
</style></head><body>
<h1>Where the bytes go: garbage collection and compaction</h1>
<div class="meta">run {html.escape(run["run_id"])} &middot; {html.escape(run["started_at"])} &middot;
{len(summary["bookies"])} bookies &middot; {len(summary["entry_logs"])} entry logs &middot; mode {html.escape(run["mode"])}
&middot; {run["duration_s"]:.1f} s on {html.escape(run["spark_master"])}</div>
{_unreadable_html(summary)}
<div class="cards">{card_html}</div>
<h2>Compaction plan (threshold {p["threshold"]:.2f}; recommended {summary["what_if"]["recommended_threshold"]:.2f})</h2>
<p>{len(p["logs"])} entry logs to compact: frees {human(p["bytes_reclaimed"])}, rewrites {human(p["bytes_rewritten"])}.
Hand it to the bookies with <code>bk shell compact --plan summary.json</code>.</p>
<img src="what_if.png" alt="what-if curve">
<h2>Bookies</h2>
<img src="reclaimable_per_bookie.png" alt="reclaimable per bookie">
{_table(summary["bookies"], [("bookie_id", "bookie"), ("total_bytes", "total"), ("live_bytes", "live"),
                             ("reclaimable_bytes", "reclaimable"), ("deleted_bytes", "deleted ledgers"),
                             ("over_replicated_bytes", "over-replicated"), ("entry_logs", "logs"),
                             ("open_logs", "open logs"), ("invalid_bytes", "unreadable bytes")], 100)}
<img src="usage_histogram.png" alt="usage histogram">
<h2>Where the space goes: owners (topics, applications)</h2>
{_table(space["top_owners"], [("owner", "owner"), ("bytes", "bytes (all replicas)"), ("live_bytes", "live"),
                              ("ledgers", "ledgers")])}
<h2>Largest ledgers</h2>
{_table(space["top_ledgers"], [("ledger_id", "ledger"), ("bytes", "bytes (all replicas)"), ("bookies", "bookies"),
                               ("state", "state"), ("deleted", "deleted"), ("over_replicated_bytes", "over-replicated"),
                               ("owner", "owner")])}
<h2>Under-replicated segments ({space["under_replicated_count"]})</h2>
{_table(space["under_replicated_segments"], [("ledger_id", "ledger"), ("first_entry_id", "first entry"),
                                             ("last_entry_id", "last entry"), ("bookie_id", "bookie holding none")])}
{scan}
<h2>Emptiest entry logs</h2>
{_table(sorted(summary["entry_logs"], key=lambda r: (r["usage"], r["bookie_id"], r["log_id"])),
        [("bookie_id", "bookie"), ("log_id", "log"), ("total_bytes", "total"), ("live_bytes", "live"),
         ("usage", "usage"), ("closed", "closed")], 30)}
</body></html>
"""
    path = os.path.join(out_dir, "report.html")
    with open(path, "w") as fh:
        fh.write(doc)
    return path


# ---------------------------------------------------------------- terminal
def text_summary(summary: dict, out_dir: str, width: int = 100) -> str:
    t, p, space, w = summary["totals"], summary["plan"], summary["space"], summary["what_if"]
    lines = [f"bk analytics gc: {len(summary['bookies'])} bookies, {len(summary['entry_logs'])} entry logs, "
             f"{summary['run']['duration_s']:.1f} s",
             f"  total {human(t['total_bytes'])}   live {human(t['live_bytes'])}   reclaimable "
             f"{human(t['reclaimable_bytes'])} ({_pct(t['reclaimable_bytes'], t['total_bytes'])})   "
             f"over-replicated {human(space['over_replicated_bytes'])}",
             f"  plan @ {p['threshold']:.2f} (recommended {w['recommended_threshold']:.2f}): compact "
             f"{len(p['logs'])} logs, frees {human(p['bytes_reclaimed'])}, rewrites {human(p['bytes_rewritten'])}",
             f"  under-replicated segments: {space['under_replicated_count']}",
             *_unreadable_lines(summary),
             "  bookies with most reclaimable:"]
    for b in sorted(summary["bookies"], key=lambda b: -b["reclaimable_bytes"])[:5]:
        lines.append(f"    {b['bookie_id']:<28} {human(b['reclaimable_bytes']):>10} of {human(b['total_bytes']):>10}")
    lines.append("  largest owners:")
    for o in space["top_owners"][:5]:
        lines.append(f"    {o['owner'][:60]:<60} {human(o['bytes']):>10}")
    for s in summary.get("scan") or []:
        if s["checksum_failures"] or s["bad_tails"]:
            lines.append(f"  scan {s['bookie_id']}: {s['checksum_failures']} checksum failures, "
                         f"{s['bad_tails']} torn/garbage tails")
    lines.append(f"  written: {out_dir.rstrip('/')}/summary.json, report.html, charts"
                 + (", parquet/" if not summary.get("error") else " (no parquet/ rows for a failed run)"))
    return "\n".join(line[:width] for line in lines)


def main(argv=None) -> int:
    """python -m spark.report OUT/summary.json [--screenshot PNG]: rebuild charts and report.html."""
    argv = list(sys.argv[1:] if argv is None else argv)
    path = argv[0]
    with open(path) as fh:
        summary = json.load(fh)
    out = os.path.dirname(os.path.abspath(path))
    charts(summary, out)
    page = write_html(summary, out)
    print(page)
    if "--screenshot" in argv:
        print(screenshot(page, argv[argv.index("--screenshot") + 1]))
    return 0



CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


def screenshot(html_path: str, png_path: str, chromium: str = "chromium", width: int = 1200,
               height: int = 2400, timeout_s: float = 120.0) -> str:
    """Render report.html in headless Chromium (a fresh profile dir) to a PNG; RuntimeError if it fails."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bk-chromium-") as profile:
        cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
               f"--screenshot={os.path.abspath(png_path)}", "file://" + os.path.abspath(html_path)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0 or not os.path.exists(png_path):
        raise RuntimeError(f"chromium failed ({out.returncode}): {out.stderr[-2000:]}")
    return png_path


if __name__ == "__main__":
    raise SystemExit(main())
