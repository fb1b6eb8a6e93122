#include "link_fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "cai/core/error.h"

namespace cai::sim {

RingSteps ring_steps(const std::string& op, int n, double bytes) {
  CAI_CHECK(n >= 2, "[link fit] a collective over {} ranks moves nothing: expected >= 2", n);
  if (op == "all_reduce") return {2 * (n - 1), 2.0 * (n - 1) / n * bytes};
  if (op == "reduce_scatter" || op == "all_gather") return {n - 1, (n - 1.0) / n * bytes};
  if (op == "broadcast") return {n - 1, bytes};
  if (op == "p2p") return {1, bytes};
  fail(
      "[link fit] unknown collective '{}': expected all_reduce, reduce_scatter, all_gather, "
      "broadcast or p2p",
      op);
}

namespace {

// Minimises f over [lo, hi] (unimodal) by golden-section search.
template <class F>
double golden(F f, double lo, double hi, int iters = 80) {
  const double g = (std::sqrt(5.0) - 1) / 2;
  double c = hi - g * (hi - lo), d = lo + g * (hi - lo);
  double fc = f(c), fd = f(d);
  for (int i = 0; i < iters; ++i) {
    if (fc < fd) {
      hi = d, d = c, fd = fc;
      c = hi - g * (hi - lo), fc = f(c);
    } else {
      lo = c, c = d, fc = fd;
      d = lo + g * (hi - lo), fd = f(d);
    }
  }
  return 0.5 * (lo + hi);
}

// Log-log interpolation of y(x) over knots sorted by x; the end knots' y beyond them.
double interp_loglog(const std::vector<std::pair<double, double>>& k, double x) {
  if (k.empty()) return 0;
  if (x <= k.front().first) return k.front().second;
  if (x >= k.back().first) return k.back().second;
  size_t i = 1;
  while (k[i].first < x) ++i;
  const auto &a = k[i - 1], &b = k[i];
  const double t = std::log(x / a.first) / std::log(b.first / a.first);
  return std::exp(std::log(a.second) + t * (std::log(b.second) - std::log(a.second)));
}

// The measured group sizes around n: {lo, hi, weight of hi} (lo == hi beyond the ends or at a
// measured size).
struct Bracket {
  int lo = 0, hi = 0;
  double w = 0;
};
Bracket bracket(const std::map<int, GroupFit>& g, int n) {
  auto it = g.lower_bound(n);
  if (it == g.end()) return {g.rbegin()->first, g.rbegin()->first, 0};
  if (it->first == n || it == g.begin()) return {it->first, it->first, 0};
  const int hi = it->first, lo = std::prev(it)->first;
  return {lo, hi, static_cast<double>(n - lo) / (hi - lo)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace

double LinkFit::launch(int n) const {
  CAI_CHECK(!groups.empty(), "[link fit] {}: no group size fitted", op);
  const Bracket b = bracket(groups, n);
  auto own = [&](int m) { return groups.at(m).floor - ring_steps(op, m, 1).steps * alpha; };
  return (1 - b.w) * own(b.lo) + b.w * own(b.hi);
}

double LinkFit::bandwidth(int n, double bytes) const {
  CAI_CHECK(!groups.empty(), "[link fit] {}: no group size fitted", op);
  const Bracket b = bracket(groups, n);
  const double lo = interp_loglog(groups.at(b.lo).bandwidth, bytes);
  if (b.w == 0) return lo;
  const double hi = interp_loglog(groups.at(b.hi).bandwidth, bytes);
  return std::exp((1 - b.w) * std::log(lo) + b.w * std::log(hi));
}

double LinkFit::seconds(int n, double bytes) const {
  const RingSteps s = ring_steps(op, n, bytes);
  return launch(n) + s.steps * alpha + s.link_bytes / bandwidth(n, bytes);
}

double LinkModel::seconds(const std::string& op, int n, double bytes) const {
  auto it = ops.find(op);
  return it == ops.end() ? -1 : it->second.seconds(n, bytes);
}

double LinkModel::max_error(const std::string& op, int group) const {
  double e = 0;
  for (const FitResidual& r : residuals)
    if ((op.empty() || r.op == op) && (group == 0 || r.group == group))
      e = std::max(e, std::abs(r.error()));
  return e;
}

LinkModel fit_links(const Calibration& cal, double prior_alpha, const std::vector<int>& groups) {
  CAI_CHECK(prior_alpha >= 0 && std::isfinite(prior_alpha),
            "[link fit] prior step latency {} s: expected a finite value >= 0", prior_alpha);
  LinkModel m;
  std::map<std::string, std::map<int, const std::vector<CollectiveSample>*>> by_op;
  for (const auto& [key, v] : cal.collectives)
    if (!v.empty() && (groups.empty() || std::count(groups.begin(), groups.end(), key.second)))
      by_op[key.first][key.second] = &v;
  double alpha_min = -1;
  for (const auto& [op, per_n] : by_op) {
    LinkFit f;
    f.op = op;
    // Latency floors: per group size its fastest sample (the plateau of its smallest messages;
    // every other sample is the floor plus a bandwidth term).
    std::vector<std::pair<int, double>> floors;  // (steps, floor)
    for (const auto& [n, v] : per_n) {
      double fastest = 1e300;
      for (const CollectiveSample& s : *v) fastest = std::min(fastest, s.seconds);
      f.groups[n].floor = fastest;
      floors.push_back({ring_steps(op, n, 1).steps, fastest});
    }
    // alpha and launch0 by least squares in log space over the floors; alpha keeps every
    // measured group's launch >= 0.
    std::set<int> step_counts;
    double alpha_max = 1e300;
    for (const auto& [s, fl] : floors)
      step_counts.insert(s), alpha_max = std::min(alpha_max, fl / s);
    auto sse = [&](double launch, double alpha) {
      double e = 0;
      for (const auto& [s, fl] : floors) {
        const double d = std::log(std::max(launch + s * alpha, 1e-15)) - std::log(fl);
        e += d * d;
      }
      return e;
    };
    auto best_launch = [&](double alpha) {
      double hi = 0;
      for (const auto& [s, fl] : floors) hi = std::max(hi, fl);
      return golden([&](double l) { return sse(l, alpha); }, 0.0, hi);
    };
    if (step_counts.size() >= 2) {
      double best = 1e300;
      const int N = 2000;
      for (int i = 0; i < N; ++i) {
        const double a = alpha_max * i / N;
        const double l = best_launch(a);
        if (const double e = sse(l, a); e < best) best = e, f.alpha = a, f.launch0 = l;
      }
      f.alpha_fitted = true;
    } else {
      f.alpha = std::min(prior_alpha, 0.5 * alpha_max);
      f.launch0 = best_launch(f.alpha);
    }
    // Bandwidth per sample: what makes floor + link_bytes / beta equal its time; the sample on
    // the floor has no bandwidth term (kNoBandwidth).
    for (auto& [n, g] : f.groups)
      for (const CollectiveSample& s : *per_n.at(n)) {
        const double rem = s.seconds - g.floor;
        const double beta =
            rem > 1e-9 * s.seconds
                ? std::min(ring_steps(op, n, s.bytes).link_bytes / rem, kNoBandwidth)
                : kNoBandwidth;
        g.bandwidth.push_back({s.bytes, beta});
        if (beta < kNoBandwidth) m.capacity = std::max(m.capacity, beta);
      }
    alpha_min = alpha_min < 0 ? f.alpha : std::min(alpha_min, f.alpha);
    for (const auto& [n, v] : per_n)
      for (const CollectiveSample& s : *v)
        m.residuals.push_back({op, n, s.bytes, s.seconds, f.seconds(n, s.bytes)});
    m.ops[op] = std::move(f);
  }
  m.latency = std::max(alpha_min, 0.0);
  return m;
}

std::string link_fit_report(const LinkModel& m) {
  std::string s = fmt::format("link model: capacity {:.1f} GB/s per link, latency {:.2f} us\n",
                              m.capacity / 1e9, m.latency * 1e6);
  for (const auto& [op, f] : m.ops) {
    s += fmt::format("  {}: alpha {:.2f} us per step ({}), launch {:.2f} us\n", op, f.alpha * 1e6,
                     f.alpha_fitted ? "fitted" : "prior", f.launch0 * 1e6);
    for (const auto& [n, g] : f.groups) {
      std::vector<double> e;
      for (const FitResidual& r : m.residuals)
        if (r.op == op && r.group == n) e.push_back(std::abs(r.error()));
      s += fmt::format(
          "    {} ranks: floor {:.2f} us, bandwidth {:.1f}..{:.1f} GB/s, {} samples, |error| "
          "median {:.2f}% max {:.2f}%\n",
          n, g.floor * 1e6, g.bandwidth.front().second / 1e9, g.bandwidth.back().second / 1e9,
          e.size(), e.empty() ? 0.0 : 100 * median(e), 100 * m.max_error(op, n));
    }
  }
  return s;
}

}  // namespace cai::sim
