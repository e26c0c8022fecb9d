// SVG charts for `troupe report`: plain geometry written as text, nothing else.

#include "cli/report_svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace troupe::cli::svg {
namespace {

constexpr double width = 1000;
constexpr double plot_left = 80;
constexpr double plot_right = 980;

std::string coord(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A range that has room: a single value (or none) is widened so that ticks exist.
std::pair<double, double> widened(double lo, double hi) {
  if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi) return {0, 1};
  if (hi - lo < 1e-12 * std::max(1.0, std::abs(hi))) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    return {lo - pad, hi + pad};
  }
  return {lo, hi};
}

// Round tick steps (1, 2, 5 times a power of ten) covering [lo, hi] with about `want` ticks.
std::vector<double> ticks(double lo, double hi, int want = 6) {
  const double raw = (hi - lo) / std::max(1, want - 1);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (power * m >= raw) {
      step = power * m;
      break;
    }
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9 && out.size() < 50; t += step)
    out.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  return out;
}

// Maps data coordinates onto the plot area.
struct frame {
  double x0, x1, y0, y1;  // data range
  double top, bottom;     // pixels
  double px(double x) const { return plot_left + (x - x0) / (x1 - x0) * (plot_right - plot_left); }
  double py(double y) const { return bottom - (y - y0) / (y1 - y0) * (bottom - top); }
};

std::string open_svg(const std::string& id, double height, const std::string& title) {
  std::string s = "<svg id=\"" + escape(id) + "\" role=\"img\" viewBox=\"0 0 " + coord(width) +
                  " " + coord(height) + "\" width=\"" + coord(width) + "\" height=\"" +
                  coord(height) + "\" aria-label=\"" + escape(title) + "\">\n";
  s += "<rect x=\"0\" y=\"0\" width=\"" + coord(width) + "\" height=\"" + coord(height) +
       "\" fill=\"#ffffff\"/>\n";
  s += "<text class=\"title\" x=\"" + coord(width / 2) +
       "\" y=\"22\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">" + escape(title) +
       "</text>\n";
  return s;
}

std::string text_at(double x, double y, const std::string& t, const char* anchor, int size = 12,
                    const char* extra = "") {
  return "<text x=\"" + coord(x) + "\" y=\"" + coord(y) + "\" text-anchor=\"" + anchor +
         "\" font-size=\"" + std::to_string(size) + "\"" + extra + ">" + escape(t) + "</text>\n";
}

// Axes, grid lines and tick labels of `f`, with the axis names of `text`.
std::string axes(const frame& f, const chart_text& text, bool y_ticks = true) {
  std::string s = "<g class=\"axes\" stroke=\"#888888\" stroke-width=\"1\">\n";
  s += "<line x1=\"" + coord(plot_left) + "\" y1=\"" + coord(f.bottom) + "\" x2=\"" +
       coord(plot_right) + "\" y2=\"" + coord(f.bottom) + "\"/>\n";
  s += "<line x1=\"" + coord(plot_left) + "\" y1=\"" + coord(f.top) + "\" x2=\"" +
       coord(plot_left) + "\" y2=\"" + coord(f.bottom) + "\"/>\n</g>\n";
  std::string labels = "<g class=\"ticks\" fill=\"#333333\">\n";
  std::string grid = "<g class=\"grid\" stroke=\"#e4e4e4\" stroke-width=\"1\">\n";
  for (double t : ticks(f.x0, f.x1)) {
    const double x = f.px(t);
    grid += "<line x1=\"" + coord(x) + "\" y1=\"" + coord(f.top) + "\" x2=\"" + coord(x) +
            "\" y2=\"" + coord(f.bottom) + "\"/>\n";
    labels += text_at(x, f.bottom + 16, number(t), "middle", 11);
  }
  for (double t : y_ticks ? ticks(f.y0, f.y1) : std::vector<double>{}) {
    const double y = f.py(t);
    grid += "<line x1=\"" + coord(plot_left) + "\" y1=\"" + coord(y) + "\" x2=\"" +
            coord(plot_right) + "\" y2=\"" + coord(y) + "\"/>\n";
    labels += text_at(plot_left - 6, y + 4, number(t), "end", 11);
  }
  s = grid + "</g>\n" + s + labels + "</g>\n";
  s += text_at((plot_left + plot_right) / 2, f.bottom + 36, text.x_label, "middle", 12,
               " class=\"x-label\"");
  const double mid = (f.top + f.bottom) / 2;
  s += "<text class=\"y-label\" x=\"18\" y=\"" + coord(mid) +
       "\" text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 18 " + coord(mid) +
       ")\">" + escape(text.y_label) + "</text>\n";
  return s;
}

std::string legend(const std::vector<legend_entry>& entries, double y) {
  std::string s = "<g class=\"legend\">\n";
  double x = plot_left;
  for (const auto& e : entries) {
    s += "<rect x=\"" + coord(x) + "\" y=\"" + coord(y - 10) +
         "\" width=\"14\" height=\"10\" fill=\"" + escape(e.color) + "\"/>\n";
    s += text_at(x + 18, y, e.name, "start", 12);
    x += 36 + 7.5 * static_cast<double>(e.name.size());
    if (x > plot_right - 60) {
      x = plot_left;
      y += 16;
    }
  }
  return s + "</g>\n";
}

std::string no_data(const frame& f) {
  return text_at((plot_left + plot_right) / 2, (f.top + f.bottom) / 2, "no data yet", "middle", 14,
                 " fill=\"#999999\"");
}

}  // namespace

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  return out;
}

std::string number(double v, int digits) {
  if (!std::isfinite(v)) return "\xE2\x80\x93";  // an en dash
  char buf[64];
  const double a = std::abs(v);
  if (a != 0 && (a >= 1e9 || a < 1e-4))
    std::snprintf(buf, sizeof buf, "%.*e", std::max(0, digits - 1), v);
  else
    std::snprintf(buf, sizeof buf, "%.*g",
                  std::max(digits, static_cast<int>(std::log10(a + 1)) + 1), v);
  return buf;
}

std::string line_chart(const std::string& id, const chart_text& text,
                       const std::vector<series>& lines, const std::vector<band>& bands) {
  constexpr double height = 360;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  const auto include = [&](double x, double y) {
    if (!std::isfinite(x) || !std::isfinite(y)) return;
    x0 = std::min(x0, x);
    x1 = std::max(x1, x);
    y0 = std::min(y0, y);
    y1 = std::max(y1, y);
  };
  for (const auto& l : lines)
    for (auto [x, y] : l.points) include(x, y);
  for (const auto& b : bands)
    for (const auto& [x, range] : b.points) {
      include(x, range.first);
      include(x, range.second);
    }
  const bool empty = !(x0 <= x1);
  auto [ax0, ax1] = widened(x0, x1);
  auto [ay0, ay1] = widened(y0, y1);
  const double pad = (ay1 - ay0) * 0.05;
  frame f{ax0, ax1, ay0 - pad, ay1 + pad, 40, height - 80};
  std::string s = open_svg(id, height, text.title) + axes(f, text);
  if (empty) s += no_data(f);
  std::vector<legend_entry> entries;
  for (const auto& b : bands) {
    entries.push_back({b.name, b.color});
    std::string upper, lower;
    for (const auto& [x, range] : b.points)
      if (std::isfinite(x) && std::isfinite(range.first) && std::isfinite(range.second)) {
        upper += (upper.empty() ? "" : " ") + coord(f.px(x)) + "," + coord(f.py(range.second));
        lower =
            coord(f.px(x)) + "," + coord(f.py(range.first)) + (lower.empty() ? "" : " ") + lower;
      }
    if (upper.empty()) continue;
    s += "<polygon class=\"band\" fill=\"" + escape(b.color) +
         "\" fill-opacity=\"0.3\" stroke=\"none\" points=\"" + upper + " " + lower + "\"><title>" +
         escape(b.name) + "</title></polygon>\n";
  }
  for (const auto& l : lines) {
    entries.push_back({l.name, l.color});
    std::string pts;
    for (auto [x, y] : l.points)
      if (std::isfinite(x) && std::isfinite(y))
        pts += (pts.empty() ? "" : " ") + coord(f.px(x)) + "," + coord(f.py(y));
    if (pts.empty()) continue;
    s += "<polyline class=\"series\" fill=\"none\" stroke=\"" + escape(l.color) +
         "\" stroke-width=\"" + number(l.stroke_width, 3) + "\"" +
         (l.opacity < 1 ? " stroke-opacity=\"" + number(l.opacity, 3) + "\"" : "") +
         (l.dashed ? " stroke-dasharray=\"6 4\"" : "") + " points=\"" + pts + "\"><title>" +
         escape(l.name) + "</title></polyline>\n";
    if (l.markers)
      for (auto [x, y] : l.points)
        if (std::isfinite(x) && std::isfinite(y))
          s += "<circle cx=\"" + coord(f.px(x)) + "\" cy=\"" + coord(f.py(y)) +
               "\" r=\"3\" fill=\"" + escape(l.color) + "\"><title>" + escape(l.name) + " " +
               number(x) + ": " + number(y) + "</title></circle>\n";
  }
  s += legend(entries, height - 22);
  return s + "</svg>\n";
}

std::string stacked_area_chart(const std::string& id, const chart_text& text,
                               const std::vector<double>& xs, const std::vector<layer>& layers) {
  constexpr double height = 400;
  std::vector<double> total(xs.size(), 0.0);
  for (const auto& l : layers)
    for (size_t i = 0; i < xs.size() && i < l.values.size(); ++i)
      if (std::isfinite(l.values[i]) && l.values[i] > 0) total[i] += l.values[i];
  double top_value = 0;
  for (double t : total) top_value = std::max(top_value, t);
  // Each x owns the column from halfway to the x before it to halfway to the one after: a value
  // is drawn as a flat top over its column, so that a layer's area is its values' sum (a line
  // from one x to the next would halve a one-step spike and smear it over its neighbours).
  std::vector<double> edges;
  for (size_t i = 0; i + 1 < xs.size(); ++i) edges.push_back((xs[i] + xs[i + 1]) / 2);
  if (!xs.empty()) {
    const double first = xs.size() > 1 ? xs.front() - (edges.front() - xs.front()) : xs[0] - 0.5;
    const double last = xs.size() > 1 ? xs.back() + (xs.back() - edges.back()) : xs[0] + 0.5;
    edges.insert(edges.begin(), first);
    edges.push_back(last);
  }
  const bool empty = xs.empty();
  auto [ax0, ax1] = empty ? std::pair{0.0, 1.0} : widened(edges.front(), edges.back());
  frame f{ax0, ax1, 0, top_value > 0 ? top_value * 1.05 : 1, 40, height - 100};
  std::string s = open_svg(id, height, text.title) + axes(f, text);
  if (empty) s += no_data(f);
  std::vector<double> below(xs.size(), 0.0);
  std::vector<legend_entry> entries;
  for (const auto& l : layers) {
    entries.push_back({l.name, l.color});
    std::vector<double> above = below;
    bool any = false;
    for (size_t i = 0; i < xs.size() && i < l.values.size(); ++i)
      if (std::isfinite(l.values[i]) && l.values[i] > 0) {
        above[i] += l.values[i];
        any = true;
      }
    if (any) {
      std::string d;
      for (size_t i = 0; i < xs.size(); ++i)
        d += (i == 0 ? "M" : " L") + coord(f.px(edges[i])) + "," + coord(f.py(above[i])) + " L" +
             coord(f.px(edges[i + 1])) + "," + coord(f.py(above[i]));
      for (size_t i = xs.size(); i-- > 0;)
        d += " L" + coord(f.px(edges[i + 1])) + "," + coord(f.py(below[i])) + " L" +
             coord(f.px(edges[i])) + "," + coord(f.py(below[i]));
      s += "<path class=\"layer\" d=\"" + d + " Z\" fill=\"" + escape(l.color) +
           "\" stroke=\"none\"><title>" + escape(l.name) + "</title></path>\n";
    }
    below = std::move(above);
  }
  s += legend(entries, height - 42);
  return s + "</svg>\n";
}

std::string timeline_chart(const std::string& id, const chart_text& text,
                           const std::vector<std::string>& lanes, double x0, double x1,
                           const std::vector<span>& spans, const std::vector<mark>& marks,
                           const std::vector<legend_entry>& legend_entries) {
  constexpr double lane_height = 30, top = 40;
  const double bottom = top + lane_height * static_cast<double>(std::max<size_t>(lanes.size(), 1));
  const double height = bottom + 90;
  auto [ax0, ax1] = widened(x0, x1);
  frame f{ax0, ax1, 0, static_cast<double>(lanes.size()), top, bottom};
  std::string s = open_svg(id, height, text.title);
  // Lanes instead of y ticks: a band and a name for each.
  for (size_t i = 0; i < lanes.size(); ++i) {
    const double y = top + lane_height * static_cast<double>(i);
    s += "<rect class=\"lane\" x=\"" + coord(plot_left) + "\" y=\"" + coord(y) + "\" width=\"" +
         coord(plot_right - plot_left) + "\" height=\"" + coord(lane_height) + "\" fill=\"" +
         (i % 2 ? "#ffffff" : "#f4f6f8") + "\"/>\n";
    s += text_at(plot_left - 6, y + lane_height / 2 + 4, lanes[i], "end", 11);
  }
  chart_text axis_text = text;
  axis_text.y_label.clear();
  s += axes(f, axis_text, false);
  auto lane_y = [&](int lane) { return top + lane_height * lane; };
  for (const auto& b : spans) {
    const double a = f.px(std::clamp(b.start, ax0, ax1));
    const double e = std::max(a + 2, f.px(std::clamp(b.end, ax0, ax1)));
    s += "<rect class=\"span\" x=\"" + coord(a) + "\" y=\"" + coord(lane_y(b.lane) + 5) +
         "\" width=\"" + coord(e - a) + "\" height=\"" + coord(lane_height - 10) + "\" fill=\"" +
         escape(b.color) + "\" stroke=\"#ffffff\" stroke-width=\"1\"><title>" + escape(b.label) +
         "</title></rect>\n";
    if (e - a > 7.0 * static_cast<double>(b.label.size()) + 8)
      s += text_at(a + 4, lane_y(b.lane) + lane_height / 2 + 4, b.label, "start", 11,
                   " fill=\"#ffffff\"");
  }
  for (const auto& m : marks) {
    const double x = f.px(std::clamp(m.at, ax0, ax1));
    const double y = lane_y(m.lane) + lane_height / 2;
    const std::string tip = "<title>" + escape(m.label) + "</title>";
    const std::string color = escape(m.color);
    if (m.shape == 'x')
      s += "<path class=\"mark\" d=\"M" + coord(x - 6) + "," + coord(y - 6) + " L" + coord(x + 6) +
           "," + coord(y + 6) + " M" + coord(x - 6) + "," + coord(y + 6) + " L" + coord(x + 6) +
           "," + coord(y - 6) + "\" stroke=\"" + color + "\" stroke-width=\"3\" fill=\"none\">" +
           tip + "</path>\n";
    else if (m.shape == 'd')
      s += "<path class=\"mark\" d=\"M" + coord(x) + "," + coord(y - 8) + " L" + coord(x + 7) +
           "," + coord(y) + " L" + coord(x) + "," + coord(y + 8) + " L" + coord(x - 7) + "," +
           coord(y) + " Z\" fill=\"" + color + "\">" + tip + "</path>\n";
    else
      s += "<circle class=\"mark\" cx=\"" + coord(x) + "\" cy=\"" + coord(y) +
           "\" r=\"5\" fill=\"" + color + "\">" + tip + "</circle>\n";
  }
  s += legend(legend_entries, height - 22);
  return s + "</svg>\n";
}

}  // namespace troupe::cli::svg
