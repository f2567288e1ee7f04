#include "tide/launcher/health_server.h"

#include <CivetServer.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "tide/common/error.h"
#include "tide/metrics/registry.h"

#include "launcher/page.h"
#include "timeline/job_view.h"
#include "timeline/render.h"

namespace tide::launcher {

std::string status_json(const agent::AgentStatus& s) {
  nlohmann::json workers = nlohmann::json::array();
  for (const auto& w : s.workers) {
    workers.push_back({
        {"local_rank", w.local_rank},
        {"global_rank", w.global_rank},
        {"world_size", w.world_size},
        {"pid", w.pid},
    });
  }
  return nlohmann::json{
      {"state", agent::to_string(s.state)},
      {"run_id", s.run_id},
      {"restart_count", s.restart_count},
      {"remaining_restarts", s.remaining_restarts},
      {"group_rank", s.group_rank},
      {"group_world_size", s.group_world_size},
      {"world_size", s.workers.empty() ? 0 : s.workers.front().world_size},
      {"workers", workers},
      {"started_at", s.started_at},
      {"last_progress", s.last_progress},
  }
      .dump();
}

namespace {

void respond(
    mg_connection* conn,
    int code,
    const char* content_type,
    const std::string& body,
    const char* extra_headers = "") {
  const char* reason = code == 200   ? "OK"
                       : code == 400 ? "Bad Request"
                       : code == 404 ? "Not Found"
                                     : "Service Unavailable";
  mg_printf(
      conn,
      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
      "Cache-Control: no-store\r\n%sConnection: close\r\n\r\n",
      code,
      reason,
      content_type,
      body.size(),
      extra_headers);
  mg_write(conn, body.data(), body.size());
}

// A handler made of one function.
class Get : public CivetHandler {
 public:
  explicit Get(std::function<void(mg_connection*)> fn) : fn_(std::move(fn)) {}
  bool handleGet(CivetServer*, mg_connection* conn) override {
    fn_(conn);
    return true;
  }

 private:
  std::function<void(mg_connection*)> fn_;
};

// The last `lines` lines of path, reading at most its last 256 KiB; nullopt
// when it cannot be opened.
std::optional<std::string> tail(const std::string& path, int lines) {
  constexpr std::streamoff kMaxBytes = 256 * 1024;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    return std::nullopt;
  }
  std::streamoff size = in.tellg();
  std::streamoff from = std::max<std::streamoff>(0, size - kMaxBytes);
  in.seekg(from);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  size_t cut = text.size();
  int seen = 0;
  if (!text.empty() && text.back() == '\n') {
    --cut;
  }
  while (cut > 0) {
    size_t nl = text.rfind('\n', cut - 1);
    if (nl == std::string::npos) {
      cut = 0;
      break;
    }
    if (++seen == lines) {
      cut = nl + 1;
      break;
    }
    cut = nl;
  }
  return text.substr(cut);
}

// An integer query parameter within [lo, hi], or fallback when absent;
// nullopt when present but not such an integer.
std::optional<int> int_param(
    mg_connection* conn, const char* name, int fallback, int lo, int hi) {
  std::string text;
  if (!CivetServer::getParam(conn, name, text)) {
    return fallback;
  }
  int v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < lo ||
      v > hi) {
    return std::nullopt;
  }
  return v;
}

}  // namespace

struct HealthServer::Impl {
  HealthSources sources;
  std::vector<std::pair<std::string, std::unique_ptr<Get>>> handlers;
  std::unique_ptr<CivetServer> server;

  void health(mg_connection* conn) const {
    auto s = sources.status ? sources.status() : std::nullopt;
    if (!s) {
      respond(conn, 200, "application/json", R"({"state": "INIT"})");
      return;
    }
    bool down = s->state == agent::WorkerState::kFailed ||
                s->state == agent::WorkerState::kStopped;
    respond(conn, down ? 503 : 200, "application/json", status_json(*s));
  }

  void job(mg_connection* conn) const {
    if (!sources.job) {
      respond(
          conn, 404, "application/json", R"({"error": "no job view here"})");
      return;
    }
    try {
      respond(conn, 200, "application/json", sources.job());
    } catch (const std::exception& e) {
      respond(
          conn,
          503,
          "application/json",
          nlohmann::json{{"error", e.what()}}.dump());
    }
  }

  // The job view drawn by the timeline part: the same picture as
  // tide-timeline draws from `tiderun status --json`.
  void timeline(mg_connection* conn) const {
    if (!sources.job) {
      respond(conn, 404, "text/plain; charset=utf-8", "no job view here\n");
      return;
    }
    std::string svg;
    try {
      auto view = nlohmann::json::parse(sources.job());
      auto tl = timeline::timeline_of_job(view);
      std::string title = "Timeline of run " + tl.run_id;
      svg = timeline::render_svg(tl, title);
    } catch (const std::exception& e) {
      respond(
          conn, 503, "text/plain; charset=utf-8", std::string(e.what()) + "\n");
      return;
    }
    respond(conn, 200, "image/svg+xml; charset=utf-8", svg);
  }

  void log(mg_connection* conn) const {
    // Any page may read it (the job page of another node fetches it).
    const char* cors = "Access-Control-Allow-Origin: *\r\n";
    auto rank = int_param(conn, "rank", -1, 0, 1 << 20);
    auto lines = int_param(conn, "lines", 200, 1, 5000);
    if (!rank || *rank < 0 || !lines) {
      respond(
          conn,
          400,
          "text/plain; charset=utf-8",
          "expected /api/log?rank=LOCAL_RANK[&lines=1..5000]\n",
          cors);
      return;
    }
    std::string dir = sources.log_dir ? sources.log_dir(*rank) : "";
    if (dir.empty()) {
      respond(
          conn,
          404,
          "text/plain; charset=utf-8",
          "no local rank " + std::to_string(*rank) +
              " has started on this node\n",
          cors);
      return;
    }
    std::string body;
    for (const char* file : {"stdout.log", "stderr.log"}) {
      if (auto text = tail(dir + "/" + file, *lines)) {
        body += std::string("==> ") + file + " <==\n" + *text;
        if (!text->empty() && text->back() != '\n') {
          body += "\n";
        }
      }
    }
    if (body.empty()) {
      body = "local rank " + std::to_string(*rank) +
             "'s output is not kept in files here (it goes to the console); "
             "run tiderun with --tee 3 (or --redirects 3) to see it on this "
             "page\n";
    }
    respond(conn, 200, "text/plain; charset=utf-8", body, cors);
  }

  void page(mg_connection* conn) const {
    const mg_request_info* info = mg_get_request_info(conn);
    if (info == nullptr || info->local_uri == nullptr ||
        std::string_view(info->local_uri) != "/") {
      respond(conn, 404, "text/plain; charset=utf-8", "not found\n");
      return;
    }
    respond(conn, 200, "text/html; charset=utf-8", std::string(job_page()));
  }
};

HealthServer::HealthServer(const std::string& address, HealthSources sources)
    : impl_(std::make_unique<Impl>()) {
  impl_->sources = std::move(sources);
  std::vector<std::string> options = {
      "listening_ports", address, "num_threads", "4"};
  try {
    impl_->server = std::make_unique<CivetServer>(options);
  } catch (const std::exception& e) {
    throw NetworkError(
        "cannot serve health checks on " + address + ": " + e.what());
  }
  Impl* self = impl_.get();
  auto add = [&](const char* uri, void (Impl::*fn)(mg_connection*) const) {
    auto h = std::make_unique<Get>(
        [self, fn](mg_connection* conn) { (self->*fn)(conn); });
    impl_->server->addHandler(uri, h.get());
    impl_->handlers.emplace_back(uri, std::move(h));
  };
  add("/health", &Impl::health);
  add("/api/job", &Impl::job);
  add("/api/log", &Impl::log);
  add("/api/timeline.svg", &Impl::timeline);
  // The process's metrics for Prometheus: the agent's, the rendezvous', the
  // store server's (docs/observability.md).
  auto metrics_handler = std::make_unique<Get>([](mg_connection* conn) {
    respond(conn, 200, metrics::kExpositionContentType, metrics::exposition());
  });
  impl_->server->addHandler("/metrics", metrics_handler.get());
  impl_->handlers.emplace_back("/metrics", std::move(metrics_handler));
  add("/", &Impl::page);  // civetweb: the longest matching prefix wins
}

HealthServer::~HealthServer() {
  if (impl_->server) {
    impl_->server->close();
  }
}

uint16_t HealthServer::port() const {
  auto ports = impl_->server->getListeningPorts();
  return ports.empty() ? 0 : static_cast<uint16_t>(ports.front());
}

}  // namespace tide::launcher
