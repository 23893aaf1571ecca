"""Optional bar chart of the results (ns/call per case, ftjit vs anchor) written with matplotlib."""

from __future__ import annotations

from typing import Optional, Sequence

from .timing import Measurement


def write_png(path: str, measurements: Sequence[Measurement]) -> Optional[str]:
    """Writes the chart; returns None on success, or why it was skipped (matplotlib missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed"
    names = [m.case.name for m in measurements]
    xs = range(len(measurements))
    width = 0.38
    fig, ax = plt.subplots(figsize=(1.8 + 1.9 * len(measurements), 4.2))
    ft = ax.bar([x - width / 2 for x in xs], [m.ftjit_ns for m in measurements], width, label="ftjit.jit")
    an = ax.bar([x + width / 2 for x in xs], [m.anchor_ns for m in measurements], width, label="anchor")
    for bar, m in zip(ft, measurements):
        ax.annotate(f"{m.ratio:.2f}x {'' if m.passed else 'MISS'}".strip(), (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [f"{n}\n(vs {m.case.anchor.label})" for n, m in zip(names, measurements)], fontsize=8)
    ax.set_ylabel("ns per call (lower is better)")
    ax.set_title("ftjit hit latency vs anchor")
    ax.legend(handles=[ft, an], loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
