// Small SVG charts for `troupe report` (cli/report.cpp): line charts, a stacked area chart and
// a timeline, each returned as one self-contained <svg> element (no scripts, no external
// resources). Every text given here is escaped for HTML before it is written.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace troupe::cli::svg {

/// `text` with &, <, >, " and ' replaced by entities: safe inside elements and attributes.
[[nodiscard]] std::string escape(const std::string& text);

/// A number for people: at most `digits` significant digits, no exponent for everyday sizes,
/// "–" for NaN or infinity.
[[nodiscard]] std::string number(double v, int digits = 4);

/// Title and axis names of one chart.
struct chart_text {
  std::string title;
  std::string x_label;
  std::string y_label;
};

/// One line of a line chart: (x, y) points in drawing order; points that are not finite are
/// left out. `dashed` draws it dashed, `markers` puts a dot on each point (for sparse series);
/// a faint line (`opacity` below 1, a thin `stroke_width`) sits behind a bold one, as raw
/// values behind their smoothed curve.
struct series {
  std::string name;
  std::string color;
  std::vector<std::pair<double, double>> points;
  bool dashed = false;
  bool markers = false;
  double stroke_width = 2;
  double opacity = 1;
};

/// The range of values around a line: for each x the lowest and the highest y (a series with
/// more points than the chart has pixels, drawn as the band its points fill).
struct band {
  std::string name;
  std::string color;
  std::vector<std::pair<double, std::pair<double, double>>> points;  ///< x, (low, high)
};

/// A line chart with axes, tick labels and a legend; bands are drawn first, under the lines.
/// With no finite point at all it draws the frame and says that there is no data yet.
[[nodiscard]] std::string line_chart(const std::string& id, const chart_text& text,
                                     const std::vector<series>& lines,
                                     const std::vector<band>& bands = {});

/// One layer of a stacked area chart: a value for each x of the chart.
struct layer {
  std::string name;
  std::string color;
  std::vector<double> values;
};

/// Layers stacked bottom to top in the order given, over the shared, increasing `xs`. Each
/// layer is filled without an outline: a layer that is nearly empty must not paint the edge
/// of the stack below it in its colour.
[[nodiscard]] std::string stacked_area_chart(const std::string& id, const chart_text& text,
                                             const std::vector<double>& xs,
                                             const std::vector<layer>& layers);

/// A bar from `start` to `end` on one lane of a timeline (x in seconds).
struct span {
  int lane = 0;
  double start = 0;
  double end = 0;
  std::string label;  ///< written on the bar when it is wide enough, and as its tooltip
  std::string color;
};

/// A point event on one lane of a timeline.
struct mark {
  int lane = 0;
  double at = 0;
  std::string label;  ///< tooltip
  std::string color;
  char shape = 'o';  ///< 'o' circle, 'x' cross, 'd' diamond
};

/// One legend entry of a timeline.
struct legend_entry {
  std::string name;
  std::string color;
};

/// Lanes top to bottom, named by `lanes`; the x axis runs over [x0, x1] seconds.
[[nodiscard]] std::string timeline_chart(const std::string& id, const chart_text& text,
                                         const std::vector<std::string>& lanes, double x0,
                                         double x1, const std::vector<span>& spans,
                                         const std::vector<mark>& marks,
                                         const std::vector<legend_entry>& legend);

}  // namespace troupe::cli::svg
