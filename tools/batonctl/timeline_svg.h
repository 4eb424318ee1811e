#pragma once

// `batonctl timeline --svg`: a picture of the partitions the agents ran, to
// see urgent tensors overtake less urgent ones.

#include <string>

#include "baton/v1/status.pb.h"

namespace baton::batonctl {

// An SVG document: one lane per node and data channel (inline partitions in
// a lane of their own), each partition's local reduce (pale) and network
// (solid) span a rectangle coloured by priority from red (0, most urgent)
// to blue (the least urgent priority present), with a legend, a time axis
// in time since the earliest record, the tensor's name where it fits, and
// the partition's details as a tooltip.
std::string TimelineToSvg(const v1::Timeline& timeline);

}  // namespace baton::batonctl
