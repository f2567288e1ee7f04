#pragma once

#include <string>

#include "timeline/model.h"

// The picture: a Timeline drawn as one self-contained SVG, top to bottom
// (heading, legend, per node its agent's lane heading its workers' lanes,
// the time axis), with labels laid out so that none overlaps another. A node
// of more than kCollapseAbove workers (nodes.h) is drawn collapsed: one
// summary lane for all its workers.
namespace tide::timeline {

struct RenderOptions {
  // Every worker's lane, whatever the size of its node.
  bool expand = false;
  // For a page whose script opens and closes nodes (html.h): each node drawn
  // both ways, its summary lane and its workers' lanes, the hidden one
  // hidden by CSS, with the geometry the script needs in data- attributes.
  bool interactive = false;
};

std::string render_svg(
    const Timeline& timeline,
    const std::string& title,
    const RenderOptions& options = {});

}  // namespace tide::timeline
