"""A plot's legend never makes the plot wider than its place in the layout (Compare's grid); a
curve of one point stays visible."""

from __future__ import annotations

import pyqtgraph as pg

from workbench.plots import Plot


def test_a_legend_of_long_names_wraps_to_columns_that_fit_the_plot(qtbot):
    plot = Plot("Accuracy against privacy", "publishable ε", "test accuracy")
    qtbot.addWidget(plot)
    plot.resize(432, 500)
    plot.show()
    for index, name in enumerate(["2: digits-eps1-a-long-run-name", "3: digits-eps2-a-long-run-name",
                                  "4: digits-eps4-a-long-run-name", "5: dpsgd-breast-cancer-baseline"]):
        plot.curve(name, index).setData([0.5, 1.0, 2.0], [0.7, 0.8, 0.9])
    qtbot.wait(100)  # labels are laid out after they are added; the legend refits then
    item = plot.getPlotItem()
    assert plot.legend.boundingRect().width() <= plot.width()
    assert item.geometry().width() <= plot.width() + 1
    plot.resize(1200, 500)
    qtbot.wait(100)
    assert plot.legend.columnCount > 1  # room again: side by side
    plot.resize(432, 500)  # narrow again: the plot follows the view, not the wider legend it had
    qtbot.wait(100)
    assert item.geometry().width() <= plot.width() + 1


def test_a_line_with_one_point_gets_a_marker_until_it_has_a_second(qtbot):
    """A line through one point draws nothing (a PATE run of 100 queries has one privacy row): it is
    marked while alone; curves drawn with markers by design keep theirs."""
    import numpy as np

    from workbench.plots import set_curve

    plot = Plot("Privacy spent", "queries", "ε")
    qtbot.addWidget(plot)
    line, dots = plot.curve("data-independent", 0), plot.curve("released", 1, symbol="o")
    set_curve(line, np.array([100.0]), np.array([51.6]))
    assert line.opts["symbol"] == "o"
    set_curve(line, np.array([100.0, 200.0]), np.array([51.6, 70.0]))
    assert line.opts["symbol"] is None
    set_curve(dots, np.array([100.0, 200.0]), np.array([3.0, 4.0]))
    set_curve(dots, np.array([100.0]), np.array([3.0]))
    set_curve(dots, np.array([100.0, 200.0]), np.array([3.0, 4.0]))
    assert dots.opts["symbol"] == "o"


def test_a_long_title_never_widens_the_plot_past_its_place(qtbot):
    """pyqtgraph makes the title's text width the plot's minimum width: in the Audit tab at 1100 px the
    plot was 386 px wide in a 330 px place, its right part under the side panel."""
    plot = Plot("Membership tests: the bound and the attack, with a title longer than the plot", "FPR", "TPR")
    qtbot.addWidget(plot)
    plot.resize(300, 300)
    plot.show()
    qtbot.wait(100)
    plot.set_title("Another title that is also far longer than three hundred pixels of plot")
    plot.resize(280, 300)
    qtbot.wait(100)
    assert plot.getPlotItem().geometry().width() <= plot.width() + 1


def test_a_title_too_long_for_the_plot_goes_on_to_more_lines_whole(qtbot):
    """A cut title lost its end: the PATE teachers' "(private, not in ε)" at a window 1,100 px wide."""
    title = "Teachers (private, not in ε)"
    plot = Plot(title, "teacher", "held-out accuracy")
    qtbot.addWidget(plot)
    plot.resize(900, 300)
    plot.show()
    qtbot.wait(50)
    assert plot.title_lines == [title]
    plot.resize(150, 300)
    qtbot.wait(50)
    assert len(plot.title_lines) > 1 and " ".join(plot.title_lines) == title
    label = plot.getPlotItem().titleLabel
    assert label.item.boundingRect().width() <= plot.width()  # every line fits
    assert label.text.count("<br>") == len(plot.title_lines) - 1
    plot.resize(900, 300)
    qtbot.wait(50)
    assert plot.title_lines == [title]


def test_a_legend_entry_wider_than_the_plot_goes_on_to_more_lines_whole(qtbot):
    """Cut, the PATE privacy plot's "data-dependent (private diagnostic, not publishable)" lost its end
    at a window 950 px wide, and widened the plot under its neighbour: the released epsilon's point, at
    the right edge, was hidden."""
    name = "data-dependent (private diagnostic, not publishable)"
    plot = Plot("Privacy spent", "queries processed", "ε")
    qtbot.addWidget(plot)
    plot.resize(900, 400)
    plot.show()
    plot.curve(name, 0).setData([100.0, 200.0], [69.3, 124.2])
    plot.curve("released (publishable)", 1, symbol="o").setData([200.0], [185.2])
    qtbot.wait(100)
    label = plot.legend.items[0][1]
    assert label.text == name
    plot.resize(260, 400)
    qtbot.wait(100)
    assert "<br>" in label.text and label.text.replace("<br>", " ") == name
    assert label.item.boundingRect().width() <= plot.width()
    assert plot.getPlotItem().geometry().width() <= plot.width() + 1
    (x_low, x_high), _ = plot.getPlotItem().getViewBox().viewRange()
    view = plot.getPlotItem().getViewBox()
    right_edge = view.mapViewToDevice(pg.QtCore.QPointF(200.0, 185.2)).x()
    assert x_high >= 200.0 and right_edge <= plot.width()  # the released point is in sight
    plot.resize(900, 400)
    qtbot.wait(100)
    assert label.text == name


def test_tick_labels_of_a_narrow_plot_never_run_into_one_another(qtbot):
    """pyqtgraph spaces ticks by the axis's length alone: Compare's scatter at 950 px read "185185.4"."""
    import math

    from PySide6.QtGui import QFontMetrics

    plot = Plot("Finished runs", "final publishable ε", "final test accuracy", legend=False)
    qtbot.addWidget(plot)
    plot.show()
    axis = plot.getPlotItem().getAxis("bottom")
    metrics = QFontMetrics(axis.style.get("tickFont") or axis.font())

    def labels(size: float) -> list[str]:
        spacing = axis.tickSpacing(185.0, 185.6, size)[0][0]
        first = math.ceil(185.0 / spacing) * spacing
        values = [first + i * spacing for i in range(int((185.6 - first) / spacing + 1e-9) + 1)]
        return axis.tickStrings(values, 1.0, spacing)

    narrow = labels(110)
    assert len(narrow) >= 2 and sum(metrics.horizontalAdvance(t) + 10 for t in narrow) <= 110, narrow
    wide = axis.tickSpacing(185.0, 185.6, 900)
    assert wide == pg.AxisItem.tickSpacing(axis, 185.0, 185.6, 900)  # where they fit: pyqtgraph's own ticks


def test_tick_labels_of_a_short_plot_never_sit_on_one_another(qtbot):
    """Compare's membership-tests plot at 950 px: "0.8" sat on "0.6" on its 40 px value axis."""
    from PySide6.QtGui import QFontMetrics

    plot = Plot("Membership tests", "FPR", "TPR", legend=False)
    qtbot.addWidget(plot)
    axis = plot.getPlotItem().getAxis("left")
    height = QFontMetrics(axis.style.get("tickFont") or axis.font()).height()
    spacing = axis.tickSpacing(0.0, 1.0, 60)[0][0]
    count = int(1.0 / spacing + 1e-9) + 1
    assert count >= 2 and count * (height + 2) <= 60
    assert axis.tickSpacing(0.0, 1.0, 600) == pg.AxisItem.tickSpacing(axis, 0.0, 1.0, 600)
