#pragma once

#include <string>

#include "tide-timeline/model.h"

// The picture: a Timeline drawn as one self-contained SVG, top to bottom
// (heading, legend, per host an agent lane and a lane per worker, the time
// axis), with labels laid out so that none overlaps another.
namespace tide::timeline {

std::string render_svg(const Timeline& timeline, const std::string& title);

}  // namespace tide::timeline
