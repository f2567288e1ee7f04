#pragma once

#include <sys/types.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>

// Structured events (torch.distributed.elastic.events): what the agent and
// the rendezvous did, as records a handler keeps. Nothing is kept by default,
// as in torch. JSON in torch's field layout:
//   {"name": "torchelastic.worker.status.FAILED", "source": "AGENT",
//    "timestamp": 1700000000123, "metadata": {"global_rank": 1, ...}}
// tide's timestamps are milliseconds since the epoch.
namespace tide::events {

enum class EventSource { kAgent, kWorker };
const char* to_string(EventSource s);  // "AGENT", "WORKER"

using MetadataValue =
    std::variant<std::monostate, std::string, int64_t, double, bool>;

struct Event {
  using Metadata = std::map<std::string, MetadataValue>;
  std::string name;
  EventSource source = EventSource::kAgent;
  int64_t timestamp = 0;  // ms since the epoch; record() fills a 0
  std::map<std::string, MetadataValue> metadata;

  std::string serialize() const;
  // Throws InvalidArgument naming what is wrong.
  static Event deserialize(const std::string& json);
};

// A rendezvous node's state (torch's NodeState).
enum class NodeState { kInit, kRunning, kSucceeded, kFailed };
const char* to_string(NodeState s);

struct RdzvEvent {
  std::string name;
  std::string run_id;
  std::string message;
  std::string hostname;
  pid_t pid = 0;
  NodeState node_state = NodeState::kInit;
  std::string master_endpoint;
  std::optional<int> rank;
  std::optional<std::string> local_id;
  std::string error_trace;
  int64_t timestamp = 0;  // ms since the epoch (tide's addition)

  std::string serialize() const;
  static RdzvEvent deserialize(const std::string& json);
};

// Receives every recorded event. Thread safe.
class EventHandler {
 public:
  virtual ~EventHandler() = default;
  virtual void handle(const Event& e) = 0;
  virtual void handle(const RdzvEvent& e) = 0;
};

class NullEventHandler final : public EventHandler {
 public:
  void handle(const Event&) override {}
  void handle(const RdzvEvent&) override {}
};

// Appends one JSON object per line to a file; rendezvous events carry
// "event_type": "rdzv" so a reader can tell them apart.
class JsonLinesEventHandler final : public EventHandler {
 public:
  // Throws Error when the file cannot be opened.
  explicit JsonLinesEventHandler(const std::string& path);
  void handle(const Event& e) override;
  void handle(const RdzvEvent& e) override;

 private:
  std::mutex mutex_;
  std::ofstream out_;  // Guarded by mutex_.
};

// Logs each event's JSON at info level (torch's "console" handler).
class LogEventHandler final : public EventHandler {
 public:
  void handle(const Event& e) override;
  void handle(const RdzvEvent& e) override;
};

// The process-wide handler (null by default). Thread safe.
void configure(std::shared_ptr<EventHandler> handler);
bool enabled();
void record(Event e);
void record_rdzv_event(RdzvEvent e);

int64_t now_ms();

}  // namespace tide::events
