"""Optional bar chart of the results via matplotlib: ftjit vs anchor per case (dispatch in ns, from the worker-thread
rows; warm-up in ms), and thread scaling (calls/s per configuration: the default three, or each --threads count)."""

from __future__ import annotations

import textwrap
from typing import Optional, Sequence

from .threads import ScalingResult
from .timing import Measurement

_SCALE = {"ns": 1.0, "ms": 1e-6}
_YLABEL = {"ns": "ns per call (lower is better)", "ms": "ms per signature (lower is better)"}
_TITLE = {"ns": "ftjit hit latency vs anchor", "ms": "parallel warm-up vs loop"}


def _label(m: Measurement) -> str:
    if m.case.target is None:
        return f"{m.ratio:.3f}x"
    return f"{m.ratio:.3f}x{'' if m.passed else ' MISS'}"


def _scaling_panel(ax: object, scaling: ScalingResult) -> None:
    sides = [s for group in scaling.groups for s in group]
    configs = scaling.configs
    width = 0.8 / len(configs)
    for k, cfg in enumerate(configs):  # bars centred on each side's tick, one per config, 1 thread first
        xs = [i + (k - (len(configs) - 1) / 2) * width for i in range(len(sides))]
        bars = ax.bar(xs, [s.rate(cfg.key) for s in sides], width, label=cfg.label)  # type: ignore[attr-defined]
        if k > 0:  # each bar over 1 thread's
            for bar, s in zip(bars, sides):
                ax.annotate(f"{s.shown_scaling(cfg.key):.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),  # type: ignore[attr-defined]
                            ha="center", va="bottom", fontsize=7 if len(configs) <= 3 else 5)
    ax.set_xticks(range(len(sides)), [s.label for s in sides], fontsize=8)  # type: ignore[attr-defined]
    ax.set_yscale("log")  # type: ignore[attr-defined]
    ax.set_ylabel("calls/s, all threads (higher is better), log")  # type: ignore[attr-defined]
    ax.set_title("thread scaling (worker threads)")  # type: ignore[attr-defined]
    ax.legend(loc="upper right", fontsize=7)  # type: ignore[attr-defined]


def write_png(path: str, measurements: Sequence[Measurement], scaling: Optional[ScalingResult] = None) -> Optional[str]:
    """Writes the chart (one panel per unit); returns None on success, or why it was skipped (matplotlib missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed"
    shown = [m for m in measurements if m.thread == "worker" or m.case.unit == "ms"]
    groups = [(unit, [m for m in shown if m.case.unit == unit]) for unit in _SCALE]
    groups = [(unit, ms) for unit, ms in groups if ms]
    if not groups and scaling is None:
        return "nothing to chart"
    counts = [len(ms) for _, ms in groups]
    panels = len(groups) + (scaling is not None)
    # A side's bars widen with the configs it has beyond the default three.
    n_sides = sum(len(g) for g in scaling.groups) * max(1.0, len(scaling.configs) / 3) if scaling is not None else 0
    ratios = [c + 0.6 for c in counts] + ([n_sides + 0.6] if scaling is not None else [])
    fig, axes = plt.subplots(1, panels, figsize=(1.8 + 1.9 * (sum(counts) + n_sides) + 0.8 * panels, 4.6),
                             gridspec_kw={"width_ratios": ratios}, squeeze=False)
    if scaling is not None:
        _scaling_panel(axes[0][-1], scaling)
    width = 0.38
    for ax, (unit, ms) in zip(axes[0], groups):
        scale = _SCALE[unit]
        xs = range(len(ms))
        first = ms[0].case
        ft_label, an_label = ("ftjit.jit", "anchor") if unit == "ns" else (first.ftjit.label, first.anchor.label)
        ft = ax.bar([x - width / 2 for x in xs], [m.ftjit_ns * scale for m in ms], width, label=ft_label)
        an = ax.bar([x + width / 2 for x in xs], [m.anchor_ns * scale for m in ms], width, label=an_label)
        for bar, m in zip(ft, ms):
            ax.annotate(_label(m), (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                        va="bottom", fontsize=8)
        ax.set_xticks(list(xs), [f"{textwrap.fill(m.case.name, 18)}\n(vs {m.case.anchor.label})" for m in ms],
                      fontsize=7)
        values = [v for m in ms for v in (m.ftjit_ns * scale, m.anchor_ns * scale)]
        if max(values) > 50 * min(values):  # lru_cache rows next to jax.jit rows: a log axis keeps both readable
            ax.set_yscale("log")
            ax.set_ylim(min(values) / 2, max(values) * 6)  # headroom for the labels and the legend
        else:
            ax.set_ylim(0, max(values) * 1.35)
        ax.set_ylabel(_YLABEL[unit] + (", log scale" if ax.get_yscale() == "log" else ""))
        ax.set_title(_TITLE[unit])
        ax.legend(handles=[ft, an], loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
