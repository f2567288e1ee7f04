#include "timeline/html.h"

#include "timeline/text.h"

namespace tide::timeline {
namespace {

constexpr const char* kPageStyle = R"(
  body { margin: 16px; background: #ffffff; font-family: 'DejaVu Sans', Verdana, sans-serif; font-size: 13px; }
  .controls { margin: 0 0 8px 0; }
  .controls button { font: inherit; margin-right: 6px; }
)";

// Each node's group (g.node) holds its worker lanes (g.workers) and their
// summary (g.summary-lane); CSS shows one by the group's class "closed".
// Nodes are drawn where they stand at first (data-top) with their heights
// both ways; moving them is a translate by the difference, and the lines
// that span every lane (line.spans), the axis below them and the picture's
// height follow.
constexpr const char* kScript = R"(
(function () {
  const svg = document.querySelector('svg.tide-timeline');
  if (!svg) return;
  const nodes = Array.from(svg.querySelectorAll('g.node'));
  const top = Number(svg.dataset.lanesTop);
  const bottom = Number(svg.dataset.lanesBottom);
  const below = Number(svg.dataset.below);
  function layout() {
    let y = top;
    for (const node of nodes) {
      const open = !node.classList.contains('closed');
      node.setAttribute('transform', 'translate(0 ' + (y - Number(node.dataset.top)) + ')');
      y += Number(open ? node.dataset.openHeight : node.dataset.closedHeight);
      const header = node.querySelector('.node-header');
      if (!header) continue;
      header.setAttribute('aria-expanded', String(open));
      header.querySelector('.twisty').textContent = open ? '\u25be' : '\u25b8';
    }
    for (const line of svg.querySelectorAll('line.spans')) {
      line.setAttribute('y2', y);
    }
    svg.querySelector('g.bottom').setAttribute('transform', 'translate(0 ' + (y - bottom) + ')');
    const height = y + below;
    svg.setAttribute('height', height);
    svg.setAttribute('viewBox', '0 0 ' + svg.getAttribute('width') + ' ' + height);
    svg.querySelector('rect.background').setAttribute('height', height);
  }
  for (const node of nodes) {
    const header = node.querySelector('.node-header');
    if (!header) continue;  // a job view's node: nothing to open
    const toggle = () => { node.classList.toggle('closed'); layout(); };
    header.addEventListener('click', toggle);
    header.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); toggle(); }
    });
  }
  for (const button of document.querySelectorAll('.controls button')) {
    button.addEventListener('click', () => {
      const close = button.dataset.action === 'close';
      for (const node of nodes) node.classList.toggle('closed', close);
      layout();
    });
  }
})();
)";

}  // namespace

std::string render_html(
    const Timeline& timeline,
    const std::string& title,
    const RenderOptions& options) {
  RenderOptions interactive = options;
  interactive.interactive = true;
  std::string controls;
  if (!timeline.workers.empty()) {
    controls =
        "<div class=\"controls\"><button type=\"button\" "
        "data-action=\"open\">Show every worker</button><button "
        "type=\"button\" data-action=\"close\">One lane per "
        "node</button></div>\n";
  }
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta "
         "charset=\"utf-8\">\n<title>" +
         xml(title) + "</title>\n<style>" + kPageStyle +
         "</style>\n</head>\n<body>\n" + controls +
         render_svg(timeline, title, interactive) + "<script>" + kScript +
         "</script>\n</body>\n</html>\n";
}

}  // namespace tide::timeline
