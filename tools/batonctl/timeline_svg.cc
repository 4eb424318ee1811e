#include "tools/batonctl/timeline_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "baton/status_format.h"
#include "tools/batonctl/timeline.h"

namespace baton::batonctl {
namespace {

constexpr double kLabelWidth = 150;  // lane names, left of the plot
constexpr double kPlotWidth = 1000;
constexpr double kRightMargin = 30;
constexpr double kPlotTop = 100;  // below the title, legend and axis labels
constexpr double kLaneHeight = 22;
constexpr double kBarHeight = 16;
constexpr double kNodeGap = 10;
constexpr double kCharWidth = 6.2;  // of the 10 px label font, about
constexpr double kLeastUrgentHue = 240;

std::string XmlEscape(const std::string& text) {
  std::string escaped;
  for (const char c : text) {
    switch (c) {
      case '&':
        escaped += "&amp;";
        break;
      case '<':
        escaped += "&lt;";
        break;
      case '>':
        escaped += "&gt;";
        break;
      case '"':
        escaped += "&quot;";
        break;
      case '\'':
        escaped += "&apos;";
        break;
      default:
        escaped += c;
    }
  }
  return escaped;
}

// HSL with 75% saturation and 50% lightness, as "#rrggbb".
std::string HueColor(double hue) {
  const double c = 0.75;  // chroma: (1 - |2L - 1|) * S
  const double h = hue / 60;
  const double x = c * (1 - std::fabs(std::fmod(h, 2) - 1));
  double r = 0, g = 0, b = 0;
  if (h < 1) {
    r = c, g = x;
  } else if (h < 2) {
    r = x, g = c;
  } else if (h < 3) {
    g = c, b = x;
  } else if (h < 4) {
    g = x, b = c;
  } else if (h < 5) {
    r = x, b = c;
  } else {
    r = c, b = x;
  }
  const double m = 0.5 - c / 2;
  const auto byte = [m](double v) {
    return static_cast<int>(std::lround((v + m) * 255));
  };
  return absl::StrFormat("#%02x%02x%02x", byte(r), byte(g), byte(b));
}

// A tick spacing of 1, 2 or 5 times a power of ten giving at most ~10 ticks.
double TickStep(double span_us) {
  const double raw = std::max(span_us, 1.0) / 10;
  const double power = std::pow(10, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

std::string TickLabel(double us, double step_us) {
  if (step_us >= 1e6) return absl::StrFormat("%g s", us / 1e6);
  if (step_us >= 1e3) return absl::StrFormat("%g ms", us / 1e3);
  return absl::StrFormat("%g us", us);
}

// One row of the picture: a node's channel.
struct Lane {
  std::string label;
  double y;
  std::vector<const v1::PartitionTrace*> partitions;
};

std::vector<Lane> LayOutLanes(const v1::Timeline& timeline, double* bottom) {
  std::vector<const v1::NodeTimeline*> nodes;
  for (const v1::NodeTimeline& node : timeline.nodes()) nodes.push_back(&node);
  std::stable_sort(nodes.begin(), nodes.end(), [](auto* a, auto* b) {
    return a->node_rank() < b->node_rank();
  });
  std::vector<Lane> lanes;
  double y = kPlotTop;
  for (const v1::NodeTimeline* node : nodes) {
    std::map<int, std::vector<const v1::PartitionTrace*>> by_channel;
    for (const v1::PartitionTrace& trace : node->partitions()) {
      by_channel[trace.channel()].push_back(&trace);
    }
    if (by_channel.empty()) {
      lanes.push_back({node->node_name() + " (no records)", y, {}});
      y += kLaneHeight;
    }
    for (auto& [channel, partitions] : by_channel) {
      lanes.push_back(
          {channel < 0 ? node->node_name() + " inline"
                       : absl::StrCat(node->node_name(), " channel ", channel),
           y, std::move(partitions)});
      y += kLaneHeight;
    }
    y += kNodeGap;
  }
  *bottom = y;
  return lanes;
}

}  // namespace

std::string TimelineToSvg(const v1::Timeline& timeline) {
  const int64_t origin = EarliestMicros(timeline);
  int64_t latest = origin;
  int min_priority = 0;
  int max_priority = 0;
  bool first = true;
  for (const v1::NodeTimeline& node : timeline.nodes()) {
    for (const v1::PartitionTrace& trace : node.partitions()) {
      for (const Phase& phase : PartitionPhases(trace)) {
        latest = std::max(latest, phase.end_us);
      }
      min_priority =
          first ? trace.priority() : std::min(min_priority, trace.priority());
      max_priority =
          first ? trace.priority() : std::max(max_priority, trace.priority());
      first = false;
    }
  }
  const double span = std::max<double>(1, latest - origin);
  const auto x_of = [&](int64_t us) {
    return kLabelWidth + (us - origin) / span * kPlotWidth;
  };
  const auto hue_of = [&](int priority) {
    return max_priority == min_priority
               ? 0.0
               : kLeastUrgentHue * (priority - min_priority) /
                     (max_priority - min_priority);
  };

  double bottom = 0;
  const std::vector<Lane> lanes = LayOutLanes(timeline, &bottom);
  const double width = kLabelWidth + kPlotWidth + kRightMargin;
  const double height = bottom + 10;
  std::string svg = absl::StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
      "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" "
      "font-size=\"10\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"10\" y=\"20\" font-size=\"14\">job %s, steps %d..%d: local "
      "reduce (pale) and network (solid) of each partition</text>\n",
      width, height, width, height, XmlEscape(timeline.job()),
      timeline.first_step(), timeline.last_step());

  // Legend: the priority scale.
  absl::StrAppend(&svg,
                  "<defs><linearGradient id=\"priority\" x1=\"0\" x2=\"1\">");
  for (int i = 0; i <= 4; ++i) {
    absl::StrAppendFormat(&svg, "<stop offset=\"%d%%\" stop-color=\"%s\"/>",
                          i * 25, HueColor(kLeastUrgentHue * i / 4));
  }
  absl::StrAppendFormat(&svg,
                        "</linearGradient></defs>\n"
                        "<text x=\"10\" y=\"48\">priority</text>\n"
                        "<rect x=\"%.0f\" y=\"38\" width=\"200\" height=\"12\" "
                        "fill=\"url(#priority)\"/>\n"
                        "<text x=\"%.0f\" y=\"64\">%d (most urgent)</text>\n"
                        "<text x=\"%.0f\" y=\"64\" text-anchor=\"end\">%d "
                        "(least urgent)</text>\n",
                        kLabelWidth, kLabelWidth, min_priority,
                        kLabelWidth + 200, max_priority);

  // Time axis: ticks above the lanes, grid lines through them.
  const double step = TickStep(span);
  for (double t = 0; t <= span; t += step) {
    const double x = x_of(origin + static_cast<int64_t>(t));
    absl::StrAppendFormat(
        &svg,
        "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" "
        "stroke=\"#dddddd\"/>\n"
        "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>\n",
        x, kPlotTop - 8, x, bottom, x, kPlotTop - 12, TickLabel(t, step));
  }

  for (const Lane& lane : lanes) {
    absl::StrAppendFormat(&svg,
                          "<text x=\"10\" y=\"%.0f\">%s</text>\n"
                          "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" "
                          "y2=\"%.0f\" stroke=\"#eeeeee\"/>\n",
                          lane.y + kBarHeight - 4, XmlEscape(lane.label),
                          kLabelWidth, lane.y + kLaneHeight - 2,
                          kLabelWidth + kPlotWidth, lane.y + kLaneHeight - 2);
    for (const v1::PartitionTrace* t : lane.partitions) {
      if (t->started_us() <= 0 || t->done_us() < t->started_us()) continue;
      const int64_t reduced =
          std::clamp(t->reduced_us(), t->started_us(), t->done_us());
      const double hue = hue_of(t->priority());
      const std::string color = HueColor(hue);
      absl::StrAppendFormat(
          &svg,
          "<g><title>%s p%d/%d step %d, priority %d, %s, launch %d: local "
          "reduce %s, network %s%s</title>"
          "<rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"%.0f\" "
          "fill=\"%s\" fill-opacity=\"0.4\"/>"
          "<rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"%.0f\" "
          "fill=\"%s\"/>",
          XmlEscape(t->tensor()), t->partition(), t->num_partitions(),
          t->step(), t->priority(), FormatBytes(t->bytes()), t->launch_seq(),
          FormatMicros(reduced - t->started_us()),
          FormatMicros(t->done_us() - reduced), t->ok() ? "" : " (failed)",
          x_of(t->started_us()), lane.y, x_of(reduced) - x_of(t->started_us()),
          kBarHeight, color, x_of(reduced), lane.y,
          x_of(t->done_us()) - x_of(reduced), kBarHeight, color);
      const double bar = x_of(t->done_us()) - x_of(t->started_us());
      if (bar >= t->tensor().size() * kCharWidth + 4) {
        // Yellows and greens are light: dark text there.
        const bool light = hue > 40 && hue < 200;
        absl::StrAppendFormat(
            &svg, "<text x=\"%.2f\" y=\"%.0f\" fill=\"%s\">%s</text>",
            x_of(t->started_us()) + 2, lane.y + kBarHeight - 4,
            light ? "black" : "white", XmlEscape(t->tensor()));
      }
      absl::StrAppend(&svg, "</g>\n");
    }
  }
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

}  // namespace baton::batonctl
