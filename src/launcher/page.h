#pragma once

#include <string_view>

namespace tide::launcher {

// The live job page: one self-contained HTML file (src/launcher/page/
// job.html, inline CSS and JS) that polls GET /api/job on the server it came
// from and each node's GET /api/log, and draws the job's nodes, ranks,
// stragglers and timeline. Compiled into the binary at build time
// (cmake/embed_text.cmake), so tiderun serves it with no file to install.
//
// The bytes live for the whole program; thread safe.
std::string_view job_page();

}  // namespace tide::launcher
