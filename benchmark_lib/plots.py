"""PNG plots of result rows, drawn with matplotlib's Agg backend (no display needed).

Strategies keep one style in every plot: a colour per family (``ome``, ``openai``,
``grappler``, ...), and within a family a line style and a marker of their own. ResNets are
drawn against their depth; other models (InceptionV4) in a panel of their own, one point
per strategy.
"""
import dataclasses
import os

from benchmark_lib import catalog
from benchmark_lib.units import MiB

__all__ = ["Metric", "METRICS", "styles", "model_plots", "max_batch_plot", "ratio_panels"]

_LINE_STYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p", "d")


@dataclasses.dataclass(frozen=True)
class Metric:
    """A row column to plot: its file, title, axis label and scale; ``spread``: error bars
    from the step-time quartiles."""

    column: str
    file: str
    title: str
    ylabel: str
    scale: float = 1.0
    spread: bool = False


METRICS = (
    Metric("device_peak_bytes", "peak_memory_vs_depth.png", "Peak device memory",
           "device peak (MiB)", 1 / MiB),
    Metric("step_time_s", "step_time_vs_depth.png", "Step time",
           "seconds per step (median; bars: IQR)", spread=True),
)


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def styles(strategies):
    """``{strategy: matplotlib keyword arguments}``: colour by family, line style and marker
    by the strategy's place in its family and in ``strategies``. ``vanilla``, the reference,
    is black and drawn on top, since the strategies that change nothing hide it otherwise."""
    families = [f for f in dict.fromkeys(catalog.family(s) for s in strategies) if f != "vanilla"]
    members, out = {}, {}
    for index, strategy in enumerate(strategies):
        fam = catalog.family(strategy)
        place = members.setdefault(fam, 0)
        members[fam] += 1
        out[strategy] = {"color": "black" if fam == "vanilla" else f"C{families.index(fam) % 10}",
                         "zorder": 3 if fam == "vanilla" else 2,
                         "linestyle": _LINE_STYLES[place % len(_LINE_STYLES)],
                         "marker": _MARKERS[index % len(_MARKERS)], "label": strategy}
    return out


def _value(row, metric):
    """``(y, (below, above))`` of a row in the metric's unit; error bars zero without spread."""
    y = getattr(row, metric.column) * metric.scale
    if not metric.spread:
        return y, (0.0, 0.0)
    return y, ((row.step_time_s - row.step_time_q1_s) * metric.scale,
               (row.step_time_q3_s - row.step_time_s) * metric.scale)


def _draw(ax, xs, rows, metric, style, *, line):
    values = [_value(r, metric) for r in rows]
    kwargs = dict(style, linestyle=style["linestyle"] if line else "none")
    ax.errorbar(xs, [y for y, _ in values], capsize=3 if metric.spread else 0,
                yerr=[[e[0] for _, e in values], [e[1] for _, e in values]]
                if metric.spread else None, **kwargs)


def _images(rows):
    return ", ".join(f"{s}x{s}" for s in sorted({r.image_size for r in rows}))


def _resnet_panel(ax, rows, metric, style_of, batch):
    for strategy, style in style_of.items():
        points = sorted((catalog.resnet_depth(r.model), r) for r in rows if r.strategy == strategy)
        if points:
            _draw(ax, [d for d, _ in points], [r for _, r in points], metric, style, line=True)
    ax.set_xticks(sorted({catalog.resnet_depth(r.model) for r in rows}))
    ax.set_xlabel("ResNet depth (layers)")
    ax.set_title(f"ResNets, batch {batch}, image {_images(rows)}")


def _other_panel(ax, rows, metric, style_of, batch, models):
    width = 0.8 / max(1, len(style_of))
    for index, (strategy, style) in enumerate(style_of.items()):
        points = [(models.index(r.model), r) for r in rows if r.strategy == strategy]
        if points:
            offset = (index - (len(style_of) - 1) / 2) * width
            _draw(ax, [x + offset for x, _ in points], [r for _, r in points], metric, style,
                  line=False)
    ax.set_xticks(range(len(models)), models)
    ax.set_xlim(-0.5, len(models) - 0.5)
    ax.set_title(f"{', '.join(models)}, batch {batch}, image {_images(rows)}")


def _model_figure(rows, metric, path, model_order, strategy_order):
    plt = _pyplot()
    batches = sorted({r.batch_size for r in rows})
    resnets = [r for r in rows if catalog.resnet_depth(r.model) is not None]
    others = [r for r in rows if catalog.resnet_depth(r.model) is None]
    other_models = [m for m in model_order if any(r.model == m for r in others)]
    ratios = ([3] if resnets else []) + ([1 + len(other_models)] if others else [])
    fig, axes = plt.subplots(len(batches), len(ratios), squeeze=False,
                             figsize=(2.2 * sum(ratios) + 2.5, 4.2 * len(batches)),
                             gridspec_kw={"width_ratios": ratios})
    style_of = styles([s for s in strategy_order if any(r.strategy == s for r in rows)])
    for line, batch in zip(axes, batches):
        panels = iter(line)
        if resnets:
            _resnet_panel(next(panels), [r for r in resnets if r.batch_size == batch], metric,
                          style_of, batch)
        if others:
            _other_panel(next(panels), [r for r in others if r.batch_size == batch], metric,
                         style_of, batch, other_models)
        for ax in line:
            ax.set_ylabel(metric.ylabel)
            ax.grid(True, alpha=0.3)
            ax.set_ylim(bottom=0)
    legend = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend([legend[s] for s in style_of if s in legend], [s for s in style_of if s in legend],
               loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small", title="strategy")
    fig.suptitle(metric.title)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def model_plots(rows, out_dir, model_order=(), strategy_order=()):
    """Draw each of :data:`METRICS` for the ok rows, every model of them; return the paths."""
    ok = [r for r in rows if r.ok]
    strategies = list(strategy_order) + sorted({r.strategy for r in ok} - set(strategy_order))
    models = list(model_order) + sorted({r.model for r in ok} - set(model_order))
    return [_model_figure(ok, metric, os.path.join(out_dir, metric.file), models, strategies)
            for metric in METRICS if ok]


def max_batch_plot(summaries, out_dir):
    """Bars of the largest batch per strategy, one panel per model; returns the path."""
    plt = _pyplot()
    models = list(dict.fromkeys(s.model for s in summaries))
    style_of = styles(list(dict.fromkeys(s.strategy for s in summaries)))
    fig, axes = plt.subplots(1, len(models), squeeze=False,
                             figsize=(max(6, 1.2 * len(summaries)), 4.5))
    for ax, model in zip(axes[0], models):
        items = [s for s in summaries if s.model == model]
        bars = ax.bar([s.strategy for s in items], [s.max_batch for s in items],
                      color=[style_of[s.strategy]["color"] for s in items])
        for bar, s in zip(bars, items):
            ax.annotate(f"{s.max_batch}{'+' if s.capped else ''}",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize="small")
        first = items[0]
        ax.set_title(f"Largest batch within {first.budget_bytes / MiB:.0f} MiB, {model}, "
                     f"image {first.image_size}x{first.image_size}")
        ax.set_ylabel("largest batch (images per step)")
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    path = os.path.join(out_dir, "max_batch.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def ratio_panels(panels, path, labels, columns=3, ylabel="ratio to plain fit"):
    """Bars of two ratios per item, one panel per ``(title, items)`` of ``panels``; each
    item ``(name, first, second, missing)``, ``missing`` written in place of the bars when
    a ratio is None. ``labels``: the two ratios' names. A line marks 1. Returns ``path``."""
    plt = _pyplot()
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, min(columns, len(panels)), squeeze=False,
                             figsize=(5.5 * min(columns, len(panels)), 4.2 * rows))
    for ax, (title, items) in zip(axes.flat, panels):
        _ratio_panel(ax, title, items, labels, ylabel)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _ratio_panel(ax, title, items, labels, ylabel):
    width = 0.4
    for place, (_, first, second, missing) in enumerate(items):
        if first is None or second is None:
            ax.annotate(missing, (place, 0.05), ha="center", va="bottom", rotation=90,
                        fontsize="small", color="C3")
            continue
        for offset, value, colour in ((-width / 2, first, "C0"), (width / 2, second, "C1")):
            ax.bar(place + offset, value, width, color=colour)
            ax.annotate(f"{value:.2f}", (place + offset, value), ha="center", va="bottom",
                        fontsize="x-small")
    ax.axhline(1.0, color="black", linewidth=0.8)
    highest = max([1.0] + [value for item in items for value in item[1:3] if value is not None])
    ax.set_ylim(0, 1.3 * highest)  # room for the legend above the bars
    ax.set_xticks(range(len(items)), [item[0] for item in items], rotation=35, ha="right",
                  fontsize="small")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    from matplotlib.patches import Patch  # pylint: disable=import-outside-toplevel

    ax.legend(handles=[Patch(color="C0", label=labels[0]), Patch(color="C1", label=labels[1])],
              fontsize="small", loc="upper left")
