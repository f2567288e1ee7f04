#include "tide/events/events.h"

#include <unistd.h>

#include <chrono>

#include <nlohmann/json.hpp>

#include "tide/common/error.h"
#include "tide/common/logging.h"

namespace tide::events {

using nlohmann::json;

namespace {

std::mutex g_mutex;
std::shared_ptr<EventHandler> g_handler = std::make_shared<NullEventHandler>();

json to_json(const MetadataValue& v) {
  return std::visit(
      [](const auto& x) -> json {
        if constexpr (std::is_same_v<
                          std::decay_t<decltype(x)>,
                          std::monostate>) {
          return nullptr;
        } else {
          return x;
        }
      },
      v);
}

MetadataValue from_json(const json& j) {
  if (j.is_null()) {
    return std::monostate{};
  }
  if (j.is_boolean()) {
    return j.get<bool>();
  }
  if (j.is_number_integer()) {
    return j.get<int64_t>();
  }
  if (j.is_number()) {
    return j.get<double>();
  }
  if (j.is_string()) {
    return j.get<std::string>();
  }
  throw InvalidArgument(
      "event metadata values are null, bool, number or string, not " +
      j.dump());
}

json parse_object(const std::string& text, const char* what) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw InvalidArgument(
        std::string(what) + ": not a JSON object: " + text.substr(0, 200));
  }
  return j;
}

template <typename T>
T field(const json& j, const char* key, const char* what) {
  auto it = j.find(key);
  if (it == j.end()) {
    throw InvalidArgument(std::string(what) + ": missing \"" + key + "\"");
  }
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw InvalidArgument(
        std::string(what) + ": \"" + key + "\" has the wrong type");
  }
}

json rdzv_json(const RdzvEvent& e) {
  return json{
      {"name", e.name},
      {"run_id", e.run_id},
      {"message", e.message},
      {"hostname", e.hostname},
      {"pid", e.pid},
      {"node_state", to_string(e.node_state)},
      {"master_endpoint", e.master_endpoint},
      {"rank", e.rank ? json(*e.rank) : json(nullptr)},
      {"local_id", e.local_id ? json(*e.local_id) : json(nullptr)},
      {"error_trace", e.error_trace},
      {"timestamp", e.timestamp},
  };
}

}  // namespace

const char* to_string(EventSource s) {
  return s == EventSource::kAgent ? "AGENT" : "WORKER";
}

const char* to_string(NodeState s) {
  switch (s) {
    case NodeState::kInit:
      return "INIT";
    case NodeState::kRunning:
      return "RUNNING";
    case NodeState::kSucceeded:
      return "SUCCEEDED";
    case NodeState::kFailed:
      return "FAILED";
  }
  return "INIT";
}

int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch())
      .count();
}

std::string Event::serialize() const {
  json meta = json::object();
  for (const auto& [k, v] : metadata) {
    meta[k] = to_json(v);
  }
  return json{
      {"name", name},
      {"source", to_string(source)},
      {"timestamp", timestamp},
      {"metadata", meta}}
      .dump();
}

Event Event::deserialize(const std::string& text) {
  json j = parse_object(text, "event");
  Event e;
  e.name = field<std::string>(j, "name", "event");
  std::string source = field<std::string>(j, "source", "event");
  if (source != "AGENT" && source != "WORKER") {
    throw InvalidArgument(
        "event: source must be AGENT or WORKER, not " + source);
  }
  e.source = source == "AGENT" ? EventSource::kAgent : EventSource::kWorker;
  e.timestamp =
      j.contains("timestamp") ? field<int64_t>(j, "timestamp", "event") : 0;
  if (j.contains("metadata") && !j["metadata"].is_null()) {
    if (!j["metadata"].is_object()) {
      throw InvalidArgument("event: metadata must be an object");
    }
    for (const auto& [k, v] : j["metadata"].items()) {
      e.metadata[k] = from_json(v);
    }
  }
  return e;
}

std::string RdzvEvent::serialize() const {
  return rdzv_json(*this).dump();
}

RdzvEvent RdzvEvent::deserialize(const std::string& text) {
  json j = parse_object(text, "rendezvous event");
  const char* what = "rendezvous event";
  RdzvEvent e;
  e.name = field<std::string>(j, "name", what);
  e.run_id = field<std::string>(j, "run_id", what);
  e.message = field<std::string>(j, "message", what);
  e.hostname = field<std::string>(j, "hostname", what);
  e.pid = field<pid_t>(j, "pid", what);
  std::string state = field<std::string>(j, "node_state", what);
  bool known = false;
  for (NodeState s :
       {NodeState::kInit,
        NodeState::kRunning,
        NodeState::kSucceeded,
        NodeState::kFailed}) {
    if (state == to_string(s)) {
      e.node_state = s;
      known = true;
    }
  }
  if (!known) {
    throw InvalidArgument("rendezvous event: unknown node_state " + state);
  }
  e.master_endpoint = j.value("master_endpoint", "");
  if (j.contains("rank") && !j["rank"].is_null()) {
    e.rank = field<int>(j, "rank", what);
  }
  if (j.contains("local_id") && !j["local_id"].is_null()) {
    e.local_id = field<std::string>(j, "local_id", what);
  }
  e.error_trace = j.value("error_trace", "");
  e.timestamp = j.value("timestamp", int64_t{0});
  return e;
}

JsonLinesEventHandler::JsonLinesEventHandler(const std::string& path)
    : out_(path, std::ios::app) {
  if (!out_) {
    throw Error("cannot open the events file " + path);
  }
}

void JsonLinesEventHandler::handle(const Event& e) {
  std::string line = e.serialize();
  std::lock_guard lock(mutex_);
  out_ << line << '\n';
  out_.flush();
}

void JsonLinesEventHandler::handle(const RdzvEvent& e) {
  json j = rdzv_json(e);
  j["event_type"] = "rdzv";
  std::string line = j.dump();
  std::lock_guard lock(mutex_);
  out_ << line << '\n';
  out_.flush();
}

void LogEventHandler::handle(const Event& e) {
  TIDE_LOG_INFO("[event] {}", e.serialize());
}

void LogEventHandler::handle(const RdzvEvent& e) {
  TIDE_LOG_INFO("[rdzv event] {}", e.serialize());
}

namespace {

std::shared_ptr<EventHandler> current_handler() {
  std::lock_guard lock(g_mutex);
  return g_handler;
}

}  // namespace

void configure(std::shared_ptr<EventHandler> handler) {
  std::lock_guard lock(g_mutex);
  g_handler =
      handler ? std::move(handler) : std::make_shared<NullEventHandler>();
}

bool enabled() {
  std::lock_guard lock(g_mutex);
  return dynamic_cast<NullEventHandler*>(g_handler.get()) == nullptr;
}

void record(Event e) {
  auto h = current_handler();
  if (e.timestamp == 0) {
    e.timestamp = now_ms();
  }
  h->handle(e);
}

void record_rdzv_event(RdzvEvent e) {
  auto h = current_handler();
  if (e.timestamp == 0) {
    e.timestamp = now_ms();
  }
  if (e.pid == 0) {
    e.pid = ::getpid();
  }
  h->handle(e);
}

}  // namespace tide::events
