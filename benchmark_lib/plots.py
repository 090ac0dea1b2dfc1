"""PNG plots of benchmark rows, drawn with matplotlib's Agg backend (no display needed)."""
import os
import re

__all__ = ["resnet_depth", "depth_plots", "max_batch_plot"]

_RESNET = re.compile(r"^resnet(\d+)$")
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">")  # strategies stay distinguishable


def resnet_depth(model):
    """The depth of a ``resnetNN`` model name, or None for other models."""
    match = _RESNET.match(model)
    return int(match.group(1)) if match else None


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _series(rows, column, strategy_order):
    """``{batch: {strategy: [(depth, value), ...]}}`` for ok ResNet rows with ``column`` set."""
    series = {}
    for r in rows:
        depth = resnet_depth(r["model"])
        if depth is None or r["status"] != "ok" or r.get(column) is None:
            continue
        by_strategy = series.setdefault(r["batch_size"], {})
        by_strategy.setdefault(r["strategy"], []).append((depth, r[column]))
    order = list(strategy_order)
    return {b: dict(sorted(s.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order
                                                      else len(order), kv[0])))
            for b, s in sorted(series.items())}


def _depth_figure(series, path, ylabel, scale, title):
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(series), figsize=(6 * len(series), 4.5), squeeze=False)
    for ax, (batch, by_strategy) in zip(axes[0], series.items()):
        for i, (strategy, points) in enumerate(by_strategy.items()):
            points.sort()
            ax.plot([d for d, _ in points], [v * scale for _, v in points],
                    marker=_MARKERS[i % len(_MARKERS)], linestyle=("-", "--", ":")[i // 10 % 3],
                    label=strategy)
        ax.set_xlabel("ResNet depth")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}, batch {batch}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def depth_plots(rows, out_dir, strategy_order=()):
    """Draw peak device memory and step time against ResNet depth, one line per strategy.

    Returns the paths written (none when no ResNet row ran ok).
    """
    written = []
    for column, name, ylabel, scale, title in (
            ("device_peak", "peak_memory_vs_depth.png", "device peak (MiB)", 1 / 2**20,
             "Peak device memory"),
            ("step_time", "step_time_vs_depth.png", "seconds per step", 1.0, "Step time")):
        series = _series(rows, column, strategy_order)
        if series:
            written.append(_depth_figure(series, os.path.join(out_dir, name), ylabel, scale, title))
    return written


def max_batch_plot(summary, out_dir):
    """Bars of the largest batch per strategy (one panel per model); returns the path or None."""
    if not summary:
        return None
    plt = _pyplot()
    models = list(dict.fromkeys(s["model"] for s in summary))
    fig, axes = plt.subplots(1, len(models), figsize=(max(6, 1.2 * len(summary)), 4.5),
                             squeeze=False)
    for ax, model in zip(axes[0], models):
        items = [s for s in summary if s["model"] == model]
        bars = ax.bar([s["strategy"] for s in items], [s["max_batch"] for s in items])
        for bar, s in zip(bars, items):
            ax.annotate(f"{s['max_batch']}{'+' if s.get('capped') else ''}",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize="small")
        budget = items[0].get("budget")
        ax.set_title(f"Largest batch, {model}"
                     + (f", budget {budget / 2**20:.0f} MiB" if budget else ""))
        ax.set_ylabel("batch size")
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    path = os.path.join(out_dir, "max_batch.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
