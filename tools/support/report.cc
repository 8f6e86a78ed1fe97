// `nibble quantize --report` files: written atomically, read back as a human summary and as a PNG
// plot (cairo), on a log scale, of per-linear relative output error RTN vs AWQ (AWQ reports) or
// of per-linear relative weight error (RTN reports). Cairo is optional (CMake NIBBLE_WITH_CAIRO);
// without it the plot is a named error.
#ifdef NIBBLE_HAVE_CAIRO
#include <cairo.h>
#endif

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/file.h"
#include "io/json.h"
#include "support/report.h"

namespace nibble {

namespace {

Result<nlohmann::json> LoadReport(const std::string& path) {
  NIBBLE_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
  if (!j.is_object() || j.value("nibble_report", "") != "quantize")
    return MakeError(path, ": not a nibble quantize report (no \"nibble_report\": \"quantize\")");
  return j;
}

std::string Fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

std::string ShortName(const std::string& full) {
  // "model.layers.3.self_attn.q_proj" -> "q_proj"
  const size_t dot = full.rfind('.');
  return dot == std::string::npos ? full : full.substr(dot + 1);
}

int64_t LayerOf(const std::string& name) {
  // "model.layers.3.self_attn.q_proj" -> 3; -1 for lm_head and other non-layer linears.
  const std::string key = "layers.";
  const size_t p = name.find(key);
  return p == std::string::npos ? -1 : std::atoll(name.c_str() + p + key.size());
}

// Every report's export section: relative weight error per quantized linear, one line per decoder
// layer, then the worst and the median, and the linears kept in float.
std::string WeightErrorSummary(const nlohmann::json& linears) {
  std::string out, line, kept;
  int64_t layer = -2;
  std::vector<double> errs;
  double worst = 0;
  std::string worst_name;
  for (const auto& e : linears) {
    const std::string name = e.value("name", "?");
    if (!e.value("quantized", false)) {
      kept += " " + name + " (" + e.value("rule", "") + ")";
      continue;
    }
    const double err = e.value("rel_weight_error", 0.0);
    if (LayerOf(name) != layer) {
      if (!line.empty()) out += line + "\n";
      layer = LayerOf(name);
      line = layer < 0 ? "  other:" : "  layer " + std::to_string(layer) + ":";
    }
    line += " " + ShortName(name) + " " + Fmt("%.4f", err);
    errs.push_back(err);
    if (err > worst) { worst = err; worst_name = name; }
  }
  if (errs.empty()) return kept.empty() ? "" : "kept in float:" + kept + "\n";
  out = "relative weight error ||W - Q(W)||_F / ||W||_F per quantized linear (" + std::to_string(errs.size()) + "):\n" + out +
        line + "\n";
  std::sort(errs.begin(), errs.end());
  out += "weight error: median " + Fmt("%.4f", errs[errs.size() / 2]) + ", worst " + Fmt("%.4f", worst) + " (" + worst_name + ")\n";
  if (!kept.empty()) out += "kept in float:" + kept + "\n";
  return out;
}

}  // namespace

// "awq" -> "AWQ", "awq,gptq" -> "AWQ+GPTQ": the method's name in summaries and plots.
std::string MethodLabel(const std::string& algo) {
  std::string out;
  for (char c : algo) out += c == ',' ? '+' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

Result<std::string> SummarizeQuantizeReport(const std::string& path) {
  NIBBLE_ASSIGN_OR_RETURN(nlohmann::json j, LoadReport(path));
  std::string out;
  try {
    out += "model " + j.value("model_dir", "?") + " -> " + j.value("output_dir", "?") + ", algo " + j.value("quant_algo", "?") +
           ", scheme " + j.value("quant_scheme", "?") + "\n";
    if (j.contains("calibration")) {
      const auto& c = j["calibration"];
      out += "calibration: " + std::to_string(c.value("chunks", 0)) + " x " + std::to_string(c.value("seq_len", 0)) +
             " tokens from " + c.value("dataset", "?") + " (" + c.value("selection", "") + ")";
      if (j.contains("calibrated")) out += ", propagation " + j["calibrated"].value("propagate", "?");
      if (j.contains("awq") && j["awq"].value("clip", false)) out += ", AWQ clip";
      if (j.contains("gptq")) {
        const auto& g = j["gptq"];
        out += ", GPTQ damping " + Fmt("%.4g", g.value("dampening_frac", 0.0)) + " block " +
               std::to_string(g.value("block_size", 0)) + " scales " + g.value("scale_timing", "?") + " act-order " +
               g.value("actorder", "?") + (g.value("true_sequential", false) ? ", true-sequential" : "");
      }
      out += "\n";
    }
    if (j.contains("calib_layers")) {
      for (const auto& l : j["calib_layers"]) {
        out += "layer " + std::to_string(l.value("layer", 0)) + " (" + Fmt("%.1f s", l.value("seconds", 0.0)) + ")\n";
        for (const auto& m : l["mappings"]) {
          std::string name = m.value("prev_op", "?") + " ->";
          for (const auto& x : m["layers"]) name += " " + ShortName(x.get<std::string>());
          if (m.value("skipped", false)) {
            out += "  " + name + ": skipped (" + m.value("skip_reason", "") + ")\n";
          } else {
            const double a = m.value("loss_rtn", 0.0), b = m.value("loss_best", 0.0);
            out += "  " + name + ": ratio " + Fmt("%.3f", m.value("ratio", 0.0)) + (m.value("duo", false) ? " duo" : "") +
                   ", loss " + Fmt("%.4g", a) + " -> " + Fmt("%.4g", b) + (a > 0 ? " (" + Fmt("%.1f", 100.0 * (1 - b / a)) + " % lower)" : "") + "\n";
          }
        }
        std::string lins = "  output error RTN -> " + MethodLabel(j.value("quant_algo", std::string("?"))) + ":";
        for (const auto& e : l["linears"]) {
          if (!e.value("quantized", false)) continue;
          lins += " " + ShortName(e.value("name", "?")) + " " + Fmt("%.2e", e.value("rtn_output_error", 0.0)) + "->" +
                  Fmt("%.2e", e.value("method_output_error", 0.0));
          if (e.contains("gptq") && e["gptq"].value("retries", 0) > 0)
            lins += " (damping " + Fmt("%.4g", e["gptq"].value("dampening_frac", 0.0)) + " after " +
                    std::to_string(e["gptq"].value("retries", 0)) + " retries)";
        }
        out += lins + "\n";
      }
    }
    out += WeightErrorSummary(j.value("linears", nlohmann::json::array()));
    for (const auto& m : j.value("messages", nlohmann::json::array())) out += "note: " + m.get<std::string>() + "\n";
  } catch (const std::exception& e) {
    return MakeError(path, ": malformed report (", e.what(), ")");
  }
  return out;
}

#ifndef NIBBLE_HAVE_CAIRO
Status PlotQuantizeReports(const std::vector<std::string>& paths, const std::string& png_path) {
  return MakeError("built without cairo: PNG plots are unavailable (", png_path, " not written)");
}
#else
namespace {

// One plotted linear: its label, decoder layer (-1 outside the layers) and one value per series.
struct Point {
  std::string label;
  int64_t layer;
  std::vector<double> values;
};

// What a plot shows: the series (RTN vs AWQ output error, or RTN weight error) and the axis title.
struct PlotData {
  std::vector<Point> points;
  std::vector<std::string> series;
  std::string title, y_label;
};

// Layout of the plot area; margins grow to fit the longest x label and the y-axis title.
struct Frame {
  double W = 1200, H = 0, ml = 100, mr = 40, mt = 50, mb = 0;
  double l0 = 0, l1 = 1;  // log10 range of the y axis
  size_t n = 0;
  double pw() const { return W - ml - mr; }
  double ph() const { return H - mt - mb; }
  double X(size_t i) const { return ml + pw() * (static_cast<double>(i) + 0.5) / static_cast<double>(n); }
  double Y(double v) const {
    const double lv = v > 0 ? std::log10(v) : l0;
    return mt + ph() * (1.0 - (lv - l0) / (l1 - l0));
  }
};

constexpr size_t kMaxSeries = 5;
constexpr double kColors[kMaxSeries][3] = {
    {0.85, 0.2, 0.15}, {0.15, 0.35, 0.85}, {0.1, 0.6, 0.25}, {0.6, 0.3, 0.7}, {0.9, 0.6, 0.1}};

// Series s's marker at (x, y), radius r: a circle, a square, then triangles and diamonds.
void Marker(cairo_t* cr, size_t s, double x, double y, double r) {
  switch (s % 4) {
    case 0: cairo_arc(cr, x, y, r, 0, 2 * M_PI); break;
    case 1: cairo_rectangle(cr, x - r, y - r, 2 * r, 2 * r); break;
    case 2:
      cairo_move_to(cr, x, y - r);
      cairo_line_to(cr, x + r, y + r);
      cairo_line_to(cr, x - r, y + r);
      cairo_close_path(cr);
      break;
    default:
      cairo_move_to(cr, x, y - r);
      cairo_line_to(cr, x + r, y);
      cairo_line_to(cr, x, y + r);
      cairo_line_to(cr, x - r, y);
      cairo_close_path(cr);
  }
  cairo_fill(cr);
}

// Calibrated reports: RTN's and each report's method output error on calibration inputs, per
// linear of the first report; one RTN report: its weight error.
Result<PlotData> CollectPlotData(const std::vector<std::string>& paths, const std::vector<nlohmann::json>& js) {
  PlotData d;
  const nlohmann::json& j = js[0];
  try {
    const bool calibrated = j.contains("calib_layers") && !j["calib_layers"].empty();
    if (!calibrated && js.size() > 1) return MakeError(paths[0], ": an RTN report has no output errors to plot beside other methods");
    if (calibrated) {
      d.series = {"RTN"};
      std::map<std::string, size_t> index;
      for (const auto& l : j["calib_layers"])
        for (const auto& e : l["linears"])
          if (e.value("quantized", false)) {
            index[e.value("name", "?")] = d.points.size();
            d.points.push_back({ShortName(e.value("name", "?")), l.value("layer", int64_t{0}), {e.value("rtn_output_error", 0.0)}});
          }
      for (size_t r = 0; r < js.size(); ++r) {
        if (!js[r].contains("calib_layers") || js[r]["calib_layers"].empty())
          return MakeError(paths[r], ": not a calibrated (awq / gptq) report: no output errors to plot");
        d.series.push_back(MethodLabel(js[r].value("quant_algo", std::string("?"))));
        for (auto& p : d.points) p.values.push_back(0.0);  // 0: not in this report, not drawn
        for (const auto& l : js[r]["calib_layers"])
          for (const auto& e : l["linears"])
            if (auto it = index.find(e.value("name", "?")); it != index.end() && e.value("quantized", false))
              d.points[it->second].values.back() = e.value("method_output_error", 0.0);
      }
      std::string methods;
      for (size_t s = 1; s < d.series.size(); ++s) methods += (s > 1 ? ", " : "") + d.series[s];
      d.title = "relative output error per linear (calibration inputs): RTN vs " + methods;
      d.y_label = "relative output error (log scale)";
    } else {
      d.series = {j.value("quant_algo", std::string("rtn")) == "rtn" ? "RTN" : j.value("quant_algo", std::string("?"))};
      d.title = "relative weight error per linear ||W - Q(W)||_F / ||W||_F";
      d.y_label = "relative weight error (log scale)";
      for (const auto& e : j.value("linears", nlohmann::json::array()))
        if (e.value("quantized", false)) {
          const std::string name = e.value("name", "?");
          d.points.push_back({ShortName(name), LayerOf(name), {e.value("rel_weight_error", 0.0)}});
        }
    }
  } catch (const std::exception& e) {
    return MakeError(paths[0], ": malformed report (", e.what(), ")");
  }
  if (d.points.empty()) return MakeError(paths[0], ": no quantized linears in the report");
  d.title += "  -  " + j.value("model_dir", std::string());
  return d;
}

Frame MakeFrame(cairo_t* cr, const PlotData& d) {
  Frame f;
  f.n = d.points.size();
  double lo = 1e300, hi = 0;
  for (const auto& p : d.points)
    for (double v : p.values)
      if (v > 0) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
  if (hi <= 0) { lo = 1e-6; hi = 1; }
  f.l0 = std::floor(std::log10(lo));
  f.l1 = std::max(std::ceil(std::log10(hi)), f.l0 + 1);
  cairo_set_font_size(cr, 10);
  double longest = 0;
  for (const auto& p : d.points) {
    cairo_text_extents_t e;
    cairo_text_extents(cr, p.label.c_str(), &e);
    longest = std::max(longest, e.x_advance);
  }
  f.mb = longest + 40;  // vertical x labels, then the "layer N" row
  f.H = 420 + f.mb;
  return f;
}

void DrawYAxis(cairo_t* cr, const Frame& f, const std::string& label) {
  cairo_set_font_size(cr, 12);
  for (double d = f.l0; d <= f.l1 + 1e-9; d += 1) {
    const double y = f.mt + f.ph() * (1.0 - (d - f.l0) / (f.l1 - f.l0));
    cairo_set_source_rgb(cr, 0.85, 0.85, 0.85);
    cairo_move_to(cr, f.ml, y);
    cairo_line_to(cr, f.W - f.mr, y);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_move_to(cr, f.ml - 40, y + 4);
    cairo_show_text(cr, ("1e" + std::to_string(static_cast<int>(d))).c_str());
  }
  cairo_text_extents_t e;
  cairo_set_font_size(cr, 13);
  cairo_text_extents(cr, label.c_str(), &e);
  cairo_save(cr);
  cairo_move_to(cr, 28, f.mt + f.ph() / 2 + e.x_advance / 2);
  cairo_rotate(cr, -M_PI / 2);
  cairo_show_text(cr, label.c_str());
  cairo_restore(cr);
}

void DrawXLabels(cairo_t* cr, const Frame& f, const std::vector<Point>& pts) {
  for (size_t i = 0; i < pts.size(); ++i) {
    if (i == 0 || pts[i].layer != pts[i - 1].layer) {
      const double x = f.ml + f.pw() * static_cast<double>(i) / static_cast<double>(pts.size());
      cairo_set_source_rgb(cr, 0.6, 0.6, 0.6);
      cairo_move_to(cr, x, f.mt);
      cairo_line_to(cr, x, f.mt + f.ph());
      cairo_stroke(cr);
      cairo_set_source_rgb(cr, 0, 0, 0);
      cairo_set_font_size(cr, 12);
      cairo_move_to(cr, x + 3, f.H - 12);
      cairo_show_text(cr, pts[i].layer < 0 ? "other" : ("layer " + std::to_string(pts[i].layer)).c_str());
    }
    cairo_save(cr);
    cairo_set_font_size(cr, 10);
    cairo_move_to(cr, f.X(i) + 3, f.mt + f.ph() + 6);
    cairo_rotate(cr, M_PI / 2);  // reads downwards, inside the bottom margin
    cairo_show_text(cr, pts[i].label.c_str());
    cairo_restore(cr);
  }
}

// Markers only: neighbouring linears are unrelated, so no line joins them. One marker shape per
// series (Marker), side by side within the linear's slot; a 0 (missing) value is not drawn.
void DrawSeries(cairo_t* cr, const Frame& f, const PlotData& d) {
  const double slot = f.pw() / static_cast<double>(f.n), r = std::clamp(slot / 6, 2.0, 4.0);
  const double ns = static_cast<double>(d.series.size());
  for (size_t s = 0; s < d.series.size(); ++s) {
    cairo_set_source_rgb(cr, kColors[s][0], kColors[s][1], kColors[s][2]);
    const double dx = (static_cast<double>(s) - (ns - 1) / 2) * slot / (ns + 1);
    for (size_t i = 0; i < d.points.size(); ++i)
      if (d.points[i].values[s] > 0) Marker(cr, s, f.X(i) + dx, f.Y(d.points[i].values[s]), r);
  }
}

void DrawTitleAndLegend(cairo_t* cr, const Frame& f, const PlotData& d) {
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_rectangle(cr, f.ml, f.mt, f.pw(), f.ph());
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
  cairo_set_font_size(cr, 15);
  cairo_move_to(cr, f.ml, 30);
  cairo_show_text(cr, d.title.c_str());
  cairo_set_font_size(cr, 13);
  for (size_t s = 0; s < d.series.size(); ++s) {
    cairo_set_source_rgb(cr, kColors[s][0], kColors[s][1], kColors[s][2]);
    const double y = f.mt + 15 + static_cast<double>(s) * 20;
    Marker(cr, s, f.W - f.mr - 163, y, 5);  // the markers of DrawSeries
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_move_to(cr, f.W - f.mr - 150, f.mt + 20 + static_cast<double>(s) * 20);
    cairo_show_text(cr, d.series[s].c_str());
  }
}

// Encoded into memory, then written atomically: a failed write never leaves a truncated PNG.
Status WritePng(cairo_surface_t* surf, const std::string& png_path) {
  std::string png;
  const cairo_status_t st = cairo_surface_write_to_png_stream(
      surf,
      [](void* closure, const unsigned char* data, unsigned int length) {
        static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
        return CAIRO_STATUS_SUCCESS;
      },
      &png);
  if (st != CAIRO_STATUS_SUCCESS) return MakeError("cannot encode PNG ", png_path, ": ", cairo_status_to_string(st));
  const Status w = WriteFileAtomic(png_path, png.data(), png.size());
  if (!w.ok()) return w.error().WithContext("cannot write PNG " + png_path);
  return Status::Ok();
}

}  // namespace

Status PlotQuantizeReports(const std::vector<std::string>& paths, const std::string& png_path) {
  if (paths.empty() || paths.size() + 1 > kMaxSeries)
    return MakeError("--plot draws 1 to ", kMaxSeries - 1, " reports, got ", paths.size());
  std::vector<nlohmann::json> js;
  for (const auto& p : paths) {
    NIBBLE_ASSIGN_OR_RETURN(nlohmann::json j, LoadReport(p));
    js.push_back(std::move(j));
  }
  NIBBLE_ASSIGN_OR_RETURN(PlotData d, CollectPlotData(paths, js));
  // A scratch surface measures the labels; the frame fixes the picture's size.
  cairo_surface_t* probe = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, 1, 1);
  cairo_t* pc = cairo_create(probe);
  cairo_select_font_face(pc, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  const Frame f = MakeFrame(pc, d);
  cairo_destroy(pc);
  cairo_surface_destroy(probe);
  cairo_surface_t* surf = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, static_cast<int>(f.W), static_cast<int>(f.H));
  cairo_t* cr = cairo_create(surf);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  DrawYAxis(cr, f, d.y_label);
  DrawXLabels(cr, f, d.points);
  DrawSeries(cr, f, d);
  DrawTitleAndLegend(cr, f, d);
  cairo_destroy(cr);
  const Status st = WritePng(surf, png_path);
  cairo_surface_destroy(surf);
  return st;
}
#endif  // NIBBLE_HAVE_CAIRO

Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  return WriteFileAtomic(path, bytes.data(), bytes.size());
}

}  // namespace nibble
