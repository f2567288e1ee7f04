#include "tide/launcher/health_server.h"

#include <CivetServer.h>

#include <nlohmann/json.hpp>

#include "tide/common/error.h"

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

class Handler : public CivetHandler {
 public:
  explicit Handler(std::function<std::optional<agent::AgentStatus>()> status)
      : status_(std::move(status)) {}

  bool handleGet(CivetServer*, mg_connection* conn) override {
    auto s = status_();
    std::string body;
    int code = 200;
    if (!s) {
      body = R"({"state": "INIT"})";
    } else {
      body = status_json(*s);
      if (s->state == agent::WorkerState::kFailed ||
          s->state == agent::WorkerState::kStopped) {
        code = 503;
      }
    }
    mg_printf(
        conn,
        "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: "
        "%zu\r\n"
        "Connection: close\r\n\r\n",
        code,
        code == 200 ? "OK" : "Service Unavailable",
        body.size());
    mg_write(conn, body.data(), body.size());
    return true;
  }

 private:
  std::function<std::optional<agent::AgentStatus>()> status_;
};

}  // namespace

struct HealthServer::Impl {
  std::unique_ptr<Handler> handler;
  std::unique_ptr<CivetServer> server;
};

HealthServer::HealthServer(
    const std::string& address,
    std::function<std::optional<agent::AgentStatus>()> status)
    : impl_(std::make_unique<Impl>()) {
  impl_->handler = std::make_unique<Handler>(std::move(status));
  std::vector<std::string> options = {
      "listening_ports", address, "num_threads", "2"};
  try {
    impl_->server = std::make_unique<CivetServer>(options);
  } catch (const std::exception& e) {
    throw NetworkError(
        "cannot serve health checks on " + address + ": " + e.what());
  }
  impl_->server->addHandler("/health", impl_->handler.get());
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
