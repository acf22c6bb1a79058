// dist/host_values.h — collectives of small host values: the metrics, counts and per-sequence
// numbers that data-parallel steps combine over the ranks (sums and counts, then the ratios, so
// that the N-rank metrics are those of the whole batch, not means of means).
#pragma once

#include <span>
#include <vector>

#include "dist/communicator.h"

namespace lockstep {

// Elementwise sums over the ranks, in rank order (dist/communicator.h).
std::vector<double> sum_over_ranks(Communicator& comm, std::vector<double> values);
double sum_over_ranks(Communicator& comm, double value);
double max_over_ranks(Communicator& comm, double value);
// Whether `value` is true on any rank.
bool any_rank(Communicator& comm, bool value);

// Every rank's values concatenated in rank order; each rank may hold a different count.
std::vector<double> gather_over_ranks(Communicator& comm, std::span<const double> values);
std::vector<float> gather_over_ranks(Communicator& comm, std::span<const float> values);

}  // namespace lockstep
