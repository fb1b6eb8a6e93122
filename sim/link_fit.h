// The collectives' link model, fitted to a calibration's collective samples (issue #46): the
// parameters of the ring cost model that the replay runs as SimGrid flows (replay.h,
// CollectiveModel::Flows). Pure functions, no SimGrid: the GUI and tests call them too.
//
// A collective of op `op` over n ranks moving `bytes` (Calibration's byte convention) is a ring
// (a pipelined chain for broadcast) of `steps` steps whose every link carries `link_bytes`:
//   all_reduce       2(n-1) steps, 2(n-1)/n · bytes per link
//   reduce_scatter   n-1 steps,    (n-1)/n · bytes     (all_gather alike)
//   broadcast        n-1 steps,    bytes (each chain edge carries the whole buffer)
//   p2p              1 step,       bytes
// and takes  launch(n) + steps · alpha + link_bytes / beta(n, bytes):
//   alpha      the per-step latency, one per op, fitted by least squares in log space to the
//              latency floors (each group size's fastest sample, on the small-message plateau) of
//              the measured group sizes; with one
//              group size measured it is not identifiable and the prior (the cluster's intra-node
//              latency) is taken;
//   launch(n)  the floor less steps · alpha: a measured group size's own plateau; between
//              measured sizes interpolated linearly in n, beyond them the nearest one's;
//   beta(n, b) the per-link bandwidth (NCCL's protocol regimes show as a low bandwidth at small
//              messages, LL, rising to Simple's at large ones): per measured group size and
//              sampled size, the bandwidth that makes the model reproduce that sample (piecewise in
//              bytes, log-log between samples, the end samples' beyond them); the sample on the
//              floor has none (kNoBandwidth); an unmeasured group size takes log beta
//              interpolated linearly in n between the measured sizes around it (the nearest
//              one's beyond them).
// So a measured {op, group size} reproduces its samples, and an
// unmeasured group size is the ring model over the measured per-link parameters.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "cluster.h"

namespace cai::sim {

// A knot's bandwidth where the sample shows no bandwidth term (bytes/s).
constexpr double kNoBandwidth = 1e15;

struct RingSteps {
  int steps = 0;
  double link_bytes = 0;
};
// The ring shape above; throws "[link fit] unknown collective ..." for another op name.
RingSteps ring_steps(const std::string& op, int n, double bytes);

struct GroupFit {
  double floor = 0;                                  // the latency floor: the fastest sample (s)
  std::vector<std::pair<double, double>> bandwidth;  // (bytes, per-link bytes/s), by bytes
};

struct LinkFit {
  std::string op;
  double alpha = 0;           // per-step latency (s)
  double launch0 = 0;         // launch of the shared fit: floor(n) ≈ launch0 + steps(n) · alpha
  bool alpha_fitted = false;  // false: one steps count measured, alpha is the prior
  std::map<int, GroupFit> groups;  // per measured group size
  double launch(int n) const;
  double bandwidth(int n, double bytes) const;
  double seconds(int n, double bytes) const;
};

struct FitResidual {
  std::string op;
  int group = 0;
  double bytes = 0, measured = 0, model = 0;
  double error() const { return model / measured - 1; }
};

struct LinkModel {
  std::map<std::string, LinkFit> ops;  // per op with samples
  // The links' capacity: the largest fitted per-link bandwidth (a flow alone runs at its own
  // op's and size's bandwidth, bounded; concurrent flows share this).
  double capacity = 0;
  // The smallest fitted alpha: the links' latency (a flow's route latency inside a node).
  double latency = 0;
  std::vector<FitResidual> residuals;  // every fitted sample, the model against it
  bool covers(const std::string& op) const { return ops.count(op) != 0; }
  // Seconds of `op` over n ranks of `bytes` by the model; -1 when `op` has no fit.
  double seconds(const std::string& op, int n, double bytes) const;
  // Largest |error| over the residuals (of `op` and group size `group` when given).
  double max_error(const std::string& op = "", int group = 0) const;
};

// Fits every op of cal.collectives. `groups`: fit on these group sizes only (empty: every
// measured one); `prior_alpha`: the per-step latency where the samples cannot tell it (s).
LinkModel fit_links(const Calibration& cal, double prior_alpha,
                    const std::vector<int>& groups = {});

// One line per op and group size: the fit's parameters and its residuals (max and median |error|).
std::string link_fit_report(const LinkModel& m);

}  // namespace cai::sim
