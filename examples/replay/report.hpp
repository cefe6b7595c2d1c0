// replay/report.hpp: output helpers of the replay: percentiles, a small JSON writer, an SVG line
// plot and a progress bar. Nothing here talks to kvblock.
#ifndef KVBLOCK_REPLAY_REPORT_HPP
#define KVBLOCK_REPLAY_REPORT_HPP

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#if defined(_WIN32)
#include <io.h>
#define KVB_REPLAY_ISATTY(fd) _isatty(fd)
#else
#include <unistd.h>
#define KVB_REPLAY_ISATTY(fd) isatty(fd)
#endif

namespace replay {

/// Nearest-rank percentile (`q` in [0, 1]) of unsorted values; 0 when empty.
inline uint64_t percentile(std::vector<uint64_t> values, double q) {
    if (values.empty()) return 0;
    size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
    rank = std::min(std::max<size_t>(rank, 1), values.size());
    std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(rank - 1),
                     values.end());
    return values[rank - 1];
}

/// One point of the run's time series.
struct SeriesPoint {
    uint64_t step = 0;
    double hit_rate = 0;       // reused / prompt tokens of first admissions so far
    int64_t free_primary = 0;  // free primary blocks after the step
};

/// At most `max_points` points, evenly spaced, always keeping the last one.
inline std::vector<SeriesPoint> downsample(const std::vector<SeriesPoint>& all, size_t max_points) {
    if (all.size() <= max_points || max_points < 2) return all;
    std::vector<SeriesPoint> out;
    out.reserve(max_points);
    for (size_t i = 0; i < max_points; ++i) {
        size_t idx = i * (all.size() - 1) / (max_points - 1);
        out.push_back(all[idx]);
    }
    return out;
}

/// Escapes a string for JSON and SVG text (quotes, backslashes, control chars, <, >, &).
inline std::string escape_text(const std::string& s, bool xml) {
    std::string out;
    for (char c : s) {
        unsigned char u = static_cast<unsigned char>(c);
        if (xml && c == '<')
            out += "&lt;";
        else if (xml && c == '>')
            out += "&gt;";
        else if (xml && c == '&')
            out += "&amp;";
        else if (!xml && (c == '"' || c == '\\')) {
            out += '\\';
            out += c;
        } else if (!xml && u < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", u);
            out += buf;
        } else
            out += c;
    }
    return out;
}

/// A streaming JSON writer: nested objects / arrays, plain numbers, two-space indentation.
class JsonWriter {
  public:
    explicit JsonWriter(std::FILE* f) : f_(f) {}

    JsonWriter& begin_object(const char* key = nullptr) {
        open(key, '{');
        return *this;
    }
    JsonWriter& end_object() {
        close('}');
        return *this;
    }
    JsonWriter& begin_array(const char* key = nullptr) {
        open(key, '[');
        return *this;
    }
    JsonWriter& end_array() {
        close(']');
        return *this;
    }

    JsonWriter& num(const char* key, uint64_t v) {
        item(key);
        std::fprintf(f_, "%llu", static_cast<unsigned long long>(v));
        return *this;
    }
    JsonWriter& num(const char* key, int64_t v) {
        item(key);
        std::fprintf(f_, "%lld", static_cast<long long>(v));
        return *this;
    }
    JsonWriter& num(const char* key, int32_t v) { return num(key, static_cast<int64_t>(v)); }
    JsonWriter& num(const char* key, double v) {
        item(key);
        std::fputs(plain(v).c_str(), f_);
        return *this;
    }
    JsonWriter& boolean(const char* key, bool v) {
        item(key);
        std::fputs(v ? "true" : "false", f_);
        return *this;
    }
    JsonWriter& str(const char* key, const std::string& v) {
        item(key);
        std::fprintf(f_, "\"%s\"", escape_text(v, false).c_str());
        return *this;
    }
    /// A compact one-line array of three numbers (time series points).
    JsonWriter& point(uint64_t step, double rate, int64_t free_blocks) {
        item(nullptr);
        std::fprintf(f_, "[%llu, %.6f, %lld]", static_cast<unsigned long long>(step), rate,
                     static_cast<long long>(free_blocks));
        return *this;
    }
    void finish() { std::fputc('\n', f_); }

    /// A double in plain decimal notation (no exponent), trailing zeros dropped; null if not finite.
    static std::string plain(double v) {
        if (!std::isfinite(v)) return "null";
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.12f", v);
        std::string s = buf;
        while (s.back() == '0') s.pop_back();
        if (s.back() == '.') s.pop_back();
        return s == "-0" ? "0" : s;
    }

  private:
    void indent() {
        std::fputc('\n', f_);
        for (size_t i = 0; i < first_.size(); ++i) std::fputs("  ", f_);
    }
    void item(const char* key) {
        if (!first_.empty()) {
            if (!first_.back()) std::fputc(',', f_);
            first_.back() = false;
            indent();
        }
        if (key) std::fprintf(f_, "\"%s\": ", escape_text(key, false).c_str());
    }
    void open(const char* key, char c) {
        item(key);
        std::fputc(c, f_);
        first_.push_back(true);
    }
    void close(char c) {
        bool empty = first_.back();
        first_.pop_back();
        if (!empty) indent();
        std::fputc(c, f_);
    }

    std::FILE* f_;
    std::vector<bool> first_;  // per open container: no item written yet
};

/// Writes an SVG line plot of the hit rate so far (left axis) and the free primary blocks (right
/// axis) against the step. Returns false when the file cannot be written.
inline bool write_svg(const std::string& path, const std::string& title,
                      const std::vector<SeriesPoint>& points, int64_t primary_blocks) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return false;
    const double W = 860, H = 440, left = 70, right = 80, top = 50, bottom = 60;
    const double pw = W - left - right, ph = H - top - bottom;
    uint64_t max_step = points.empty() ? 1 : std::max<uint64_t>(points.back().step, 1);
    double max_rate = 0;
    for (const auto& p : points) max_rate = std::max(max_rate, p.hit_rate);
    // Left axis: 0 .. the next tenth above the largest hit rate (at least 0.1, at most 1).
    double rate_top = std::min(1.0, std::max(0.1, std::ceil(max_rate * 10 + 1e-9) / 10));
    double blocks_top = static_cast<double>(std::max<int64_t>(primary_blocks, 1));
    auto x = [&](uint64_t step) {
        return left + pw * static_cast<double>(step) / static_cast<double>(max_step);
    };
    auto y_rate = [&](double r) { return top + ph * (1 - r / rate_top); };
    auto y_blocks = [&](double b) { return top + ph * (1 - b / blocks_top); };

    std::fprintf(f,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                 "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
                 W, H, W, H);
    std::fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    std::fprintf(f, "<text x=\"%.0f\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">%s</text>\n",
                 W / 2, escape_text(title, true).c_str());
    // Grid and ticks: 5 intervals on each axis.
    for (int i = 0; i <= 5; ++i) {
        double fy = top + ph * i / 5.0;
        std::fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                     left, fy, left + pw, fy);
        std::fprintf(
            f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#1f77b4\">%.2f</text>\n",
            left - 6, fy + 4, rate_top * (1 - i / 5.0));
        std::fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#d62728\">%.0f</text>\n", left + pw + 6,
                     fy + 4, blocks_top * (1 - i / 5.0));
        double fx = left + pw * i / 5.0;
        std::fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", fx,
                     top + ph + 18, static_cast<double>(max_step) * i / 5.0);
    }
    std::fprintf(f,
                 "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
                 "stroke=\"black\"/>\n",
                 left, top, pw, ph);
    auto polyline = [&](const char* color, bool rate) {
        std::fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
                     color);
        for (const auto& p : points) {
            double py = rate ? y_rate(p.hit_rate) : y_blocks(static_cast<double>(p.free_primary));
            std::fprintf(f, "%.1f,%.1f ", x(p.step), py);
        }
        std::fprintf(f, "\"/>\n");
    };
    polyline("#d62728", false);
    polyline("#1f77b4", true);
    std::fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n",
                 left + pw / 2, H - 18);
    std::fprintf(f,
                 "<text transform=\"translate(18,%.1f) rotate(-90)\" text-anchor=\"middle\" "
                 "fill=\"#1f77b4\">prefix hit rate so far</text>\n",
                 top + ph / 2);
    std::fprintf(f,
                 "<text transform=\"translate(%.1f,%.1f) rotate(90)\" text-anchor=\"middle\" "
                 "fill=\"#d62728\">free primary blocks</text>\n",
                 W - 14, top + ph / 2);
    std::fprintf(f, "</svg>\n");
    return std::fclose(f) == 0;
}

/// A progress bar on stderr: redrawn in place at most 10 times a second on a terminal; elsewhere
/// (logs, ctest) one line per 10% of the requests.
class Progress {
  public:
    Progress(size_t total, bool enabled)
        : total_(std::max<size_t>(total, 1)), enabled_(enabled), tty_(KVB_REPLAY_ISATTY(2) != 0) {}

    void update(size_t done, uint64_t step, double hit_rate, bool force = false) {
        if (!enabled_) return;
        auto now = std::chrono::steady_clock::now();
        if (tty_) {
            if (!force && now - last_ < std::chrono::milliseconds(100)) return;
            last_ = now;
            const int width = 30;
            int filled = static_cast<int>(width * done / total_);
            std::fprintf(stderr, "\r[%s%s] %3zu%% %zu/%zu requests, step %llu, hit rate %.3f\x1b[K",
                         std::string(static_cast<size_t>(filled), '#').c_str(),
                         std::string(static_cast<size_t>(width - filled), '.').c_str(),
                         done * 100 / total_, done, total_, static_cast<unsigned long long>(step),
                         hit_rate);
            std::fflush(stderr);
            drawn_ = true;
        } else {
            size_t decile = done * 10 / total_;
            if (decile <= last_decile_) return;
            last_decile_ = decile;
            std::fprintf(stderr, "progress: %zu%% (%zu/%zu requests, step %llu, hit rate %.3f)\n",
                         done * 100 / total_, done, total_, static_cast<unsigned long long>(step),
                         hit_rate);
        }
    }
    void finish() {
        if (enabled_ && tty_ && drawn_) std::fputc('\n', stderr);
    }

  private:
    size_t total_;
    bool enabled_;
    bool tty_;
    bool drawn_ = false;
    size_t last_decile_ = 0;
    std::chrono::steady_clock::time_point last_{};
};

}  // namespace replay

#endif  // KVBLOCK_REPLAY_REPORT_HPP
