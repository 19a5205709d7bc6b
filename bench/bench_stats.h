// The statistics the C++ benchmark drivers print (engine_bench,
// map_filter_probe): medians with their min-max, and Student's t at 95%
// as ministat computes it, the same test as fio_report.ministat() (whose
// t table this one copies; bench/ministat_check.py checks that one
// against the real ministat).

#ifndef THINFS_BENCH_BENCH_STATS_H_
#define THINFS_BENCH_BENCH_STATS_H_

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace thinfs::bench {

inline double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
inline double Min(const std::vector<double>& v) {
  return v.empty() ? NAN : *std::min_element(v.begin(), v.end());
}
inline double Max(const std::vector<double>& v) {
  return v.empty() ? NAN : *std::max_element(v.begin(), v.end());
}

// "median (min–max)" with `prec` decimals; "n/a" for no samples.
inline std::string Cell(const std::vector<double>& v, int prec) {
  if (v.empty()) return "n/a";
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.*f (%.*f–%.*f)", prec, Median(v), prec, Min(v), prec, Max(v));
  return buf;
}

// Two-sided Student's t critical value at 95% for `df` degrees of freedom
// (fio_report.T95; 1.960 past 30).
inline double T95(int df) {
  static constexpr double kT[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306,
                                  2.262,  2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120,
                                  2.110,  2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
                                  2.060,  2.056, 2.052, 2.048, 2.045, 2.042};
  return df >= 1 && df <= 30 ? kT[df - 1] : 1.960;
}

// y against x as ministat words it, from the difference of the means and
// the pooled standard deviation: "+x% ± y%, proven" or "..., not proven";
// "n/a" with fewer than two samples on a side.
inline std::string Ministat(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() < 2 || y.size() < 2) return "n/a";
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double e : v) s += e;
    return s / static_cast<double>(v.size());
  };
  auto var = [&](const std::vector<double>& v) {
    const double m = mean(v);
    double s = 0;
    for (double e : v) s += (e - m) * (e - m);
    return s / static_cast<double>(v.size() - 1);
  };
  const double nx = static_cast<double>(x.size());
  const double ny = static_cast<double>(y.size());
  const int df = static_cast<int>(x.size() + y.size() - 2);
  const double s = std::sqrt(((nx - 1) * var(x) + (ny - 1) * var(y)) / df);
  const double e = T95(df) * s * std::sqrt(1 / nx + 1 / ny);
  const double d = mean(y) - mean(x);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%+.1f%% ± %.1f%%, %s", 100 * d / mean(x), 100 * e / mean(x),
                std::fabs(d) > e ? "proven" : "not proven");
  return buf;
}

}  // namespace thinfs::bench

#endif  // THINFS_BENCH_BENCH_STATS_H_
