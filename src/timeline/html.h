#pragma once

#include <string>

#include "timeline/model.h"
#include "timeline/render.h"

// The picture as an HTML page: the SVG drawn interactive, and a small inline
// script (no network, nothing else to load) that opens and closes a node's
// group of lanes when its header is clicked, moving the nodes below.
namespace tide::timeline {

std::string render_html(
    const Timeline& timeline,
    const std::string& title,
    const RenderOptions& options = {});

}  // namespace tide::timeline
