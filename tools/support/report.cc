// `nibble quantize --report` files: written atomically, read back as a human summary and as a PNG
// plot (cairo) of per-linear relative output error, RTN vs AWQ, on a log scale. Cairo is optional
// (CMake NIBBLE_WITH_CAIRO); without it the plot is a named error.
#ifdef NIBBLE_HAVE_CAIRO
#include <cairo.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "io/file.h"
#include "support/report.h"

namespace nibble {

namespace {

Result<nlohmann::json> LoadReport(const std::string& path) {
  NIBBLE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return MakeError(path, ": not valid JSON (", e.what(), ")");
  }
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

}  // namespace

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
      if (j.contains("awq")) out += ", propagation " + j["awq"].value("propagate", "?") + (j["awq"].value("clip", false) ? ", clip" : "");
      out += "\n";
    }
    if (j.contains("awq_layers")) {
      for (const auto& l : j["awq_layers"]) {
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
        std::string lins = "  output error RTN -> AWQ:";
        for (const auto& e : l["linears"])
          if (e.value("quantized", false))
            lins += " " + ShortName(e.value("name", "?")) + " " + Fmt("%.2e", e.value("rtn_output_error", 0.0)) + "->" +
                    Fmt("%.2e", e.value("awq_output_error", 0.0));
        out += lins + "\n";
      }
    }
    for (const auto& m : j.value("messages", nlohmann::json::array())) out += "note: " + m.get<std::string>() + "\n";
  } catch (const std::exception& e) {
    return MakeError(path, ": malformed report (", e.what(), ")");
  }
  return out;
}

#ifndef NIBBLE_HAVE_CAIRO
Status PlotQuantizeReport(const std::string& path, const std::string& png_path) {
  return MakeError("built without cairo: PNG plots are unavailable (", png_path, " not written)");
}
#else
Status PlotQuantizeReport(const std::string& path, const std::string& png_path) {
  NIBBLE_ASSIGN_OR_RETURN(nlohmann::json j, LoadReport(path));
  struct Point { std::string label; double rtn, awq; int64_t layer; };
  std::vector<Point> pts;
  try {
    if (!j.contains("awq_layers") || j["awq_layers"].empty()) return MakeError(path, ": the report has no AWQ layers to plot");
    for (const auto& l : j["awq_layers"])
      for (const auto& e : l["linears"])
        if (e.value("quantized", false))
          pts.push_back({ShortName(e.value("name", "?")), e.value("rtn_output_error", 0.0), e.value("awq_output_error", 0.0),
                         l.value("layer", int64_t{0})});
  } catch (const std::exception& e) {
    return MakeError(path, ": malformed report (", e.what(), ")");
  }
  if (pts.empty()) return MakeError(path, ": no quantized linears in the report");
  double lo = 1e300, hi = 0;
  for (const auto& p : pts)
    for (double v : {p.rtn, p.awq})
      if (v > 0) { lo = std::min(lo, v); hi = std::max(hi, v); }
  if (hi <= 0) { lo = 1e-6; hi = 1; }
  const double l0 = std::floor(std::log10(lo)), l1 = std::ceil(std::log10(hi)) + (std::ceil(std::log10(hi)) == std::floor(std::log10(lo)) ? 1 : 0);
  const int W = 1200, H = 600, ml = 80, mr = 40, mt = 50, mb = 90;  // mr: room for the last rotated label
  cairo_surface_t* surf = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, W, H);
  cairo_t* cr = cairo_create(surf);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  const double pw = W - ml - mr, ph = H - mt - mb;
  auto X = [&](size_t i) { return ml + pw * (static_cast<double>(i) + 0.5) / static_cast<double>(pts.size()); };
  auto Y = [&](double v) {
    const double lv = v > 0 ? std::log10(v) : l0;
    return mt + ph * (1.0 - (lv - l0) / (l1 - l0));
  };
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  // Grid and y labels (decades).
  cairo_set_font_size(cr, 12);
  for (double d = l0; d <= l1 + 1e-9; d += 1) {
    const double y = mt + ph * (1.0 - (d - l0) / (l1 - l0));
    cairo_set_source_rgb(cr, 0.85, 0.85, 0.85);
    cairo_move_to(cr, ml, y);
    cairo_line_to(cr, W - mr, y);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_move_to(cr, 10, y + 4);
    cairo_show_text(cr, ("1e" + std::to_string(static_cast<int>(d))).c_str());
  }
  // Layer separators and labels.
  for (size_t i = 0; i < pts.size(); ++i) {
    if (i == 0 || pts[i].layer != pts[i - 1].layer) {
      const double x = ml + pw * static_cast<double>(i) / static_cast<double>(pts.size());
      cairo_set_source_rgb(cr, 0.6, 0.6, 0.6);
      cairo_move_to(cr, x, mt);
      cairo_line_to(cr, x, mt + ph);
      cairo_stroke(cr);
      cairo_set_source_rgb(cr, 0, 0, 0);
      cairo_move_to(cr, x + 3, mt + ph + 60);
      cairo_show_text(cr, ("layer " + std::to_string(pts[i].layer)).c_str());
    }
    cairo_save(cr);
    cairo_set_font_size(cr, 9);
    cairo_move_to(cr, X(i) + 3, mt + ph + 8);
    cairo_rotate(cr, 1.2);
    cairo_show_text(cr, pts[i].label.c_str());
    cairo_restore(cr);
  }
  // Series: RTN red, AWQ blue, lines with dots.
  const double colors[2][3] = {{0.85, 0.2, 0.15}, {0.15, 0.35, 0.85}};
  for (int sidx = 0; sidx < 2; ++sidx) {
    cairo_set_source_rgb(cr, colors[sidx][0], colors[sidx][1], colors[sidx][2]);
    cairo_set_line_width(cr, 1.5);
    for (size_t i = 0; i < pts.size(); ++i) {
      const double v = sidx == 0 ? pts[i].rtn : pts[i].awq;
      if (i == 0) cairo_move_to(cr, X(i), Y(v));
      else cairo_line_to(cr, X(i), Y(v));
    }
    cairo_stroke(cr);
    for (size_t i = 0; i < pts.size(); ++i) {
      cairo_arc(cr, X(i), Y(sidx == 0 ? pts[i].rtn : pts[i].awq), 3, 0, 2 * M_PI);
      cairo_fill(cr);
    }
  }
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_rectangle(cr, ml, mt, pw, ph);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
  cairo_set_font_size(cr, 16);
  cairo_move_to(cr, ml, 30);
  cairo_show_text(cr, ("relative output error per linear (calibration inputs): RTN vs AWQ  -  " + j.value("model_dir", std::string())).c_str());
  cairo_set_font_size(cr, 13);
  for (int sidx = 0; sidx < 2; ++sidx) {
    cairo_set_source_rgb(cr, colors[sidx][0], colors[sidx][1], colors[sidx][2]);
    cairo_rectangle(cr, W - mr - 170, mt + 10 + sidx * 20, 14, 10);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_move_to(cr, W - mr - 150, mt + 20 + sidx * 20);
    cairo_show_text(cr, sidx == 0 ? "RTN" : "AWQ");
  }
  cairo_destroy(cr);
  // Encoded into memory, then written atomically: a failed write never leaves a truncated PNG.
  std::string png;
  const cairo_status_t st = cairo_surface_write_to_png_stream(
      surf,
      [](void* closure, const unsigned char* data, unsigned int length) {
        static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
        return CAIRO_STATUS_SUCCESS;
      },
      &png);
  cairo_surface_destroy(surf);
  if (st != CAIRO_STATUS_SUCCESS) return MakeError("cannot encode PNG ", png_path, ": ", cairo_status_to_string(st));
  const Status w = WriteFileAtomic(png_path, png.data(), png.size());
  if (!w.ok()) return w.error().WithContext("cannot write PNG " + png_path);
  return Status::Ok();
}
#endif  // NIBBLE_HAVE_CAIRO

Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  return WriteFileAtomic(path, bytes.data(), bytes.size());
}

}  // namespace nibble
