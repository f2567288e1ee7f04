#include "tide/events/events.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tide/common/error.h"

namespace tide::events {
namespace {

TEST(EventsTest, EventsRoundTripInTorchsFieldLayout) {
  Event e{
      .name = "torchelastic.worker.status.FAILED",
      .source = EventSource::kAgent,
      .timestamp = 123,
      .metadata = {
          {"global_rank", int64_t{1}},
          {"role", std::string("default")},
          {"raw_error", MetadataValue{}},
          {"ok", true},
          {"ratio", 0.5},
      }};
  std::string json = e.serialize();
  EXPECT_NE(json.find("\"source\":\"AGENT\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"raw_error\":null"), std::string::npos) << json;
  Event back = Event::deserialize(json);
  EXPECT_EQ(back.name, e.name);
  EXPECT_EQ(back.timestamp, 123);
  EXPECT_EQ(back.metadata, e.metadata);
}

TEST(EventsTest, RdzvEventsRoundTrip) {
  RdzvEvent e{
      .name = "next_rendezvous",
      .run_id = "job",
      .message = "joined",
      .hostname = "h",
      .pid = 7,
      .node_state = NodeState::kRunning,
      .master_endpoint = "h:1",
      .rank = 2,
  };
  RdzvEvent back = RdzvEvent::deserialize(e.serialize());
  EXPECT_EQ(back.node_state, NodeState::kRunning);
  EXPECT_EQ(back.rank, 2);
  EXPECT_FALSE(back.local_id.has_value());
  EXPECT_EQ(back.master_endpoint, "h:1");
}

TEST(EventsTest, MalformedJsonIsAClearError) {
  EXPECT_THROW(Event::deserialize("not json"), InvalidArgument);
  EXPECT_THROW(Event::deserialize(R"({"name": "x"})"), InvalidArgument);
  EXPECT_THROW(
      Event::deserialize(R"({"name": "x", "source": "NOPE"})"),
      InvalidArgument);
  EXPECT_THROW(
      Event::deserialize(
          R"({"name": "x", "source": "AGENT", "metadata": {"a": [1]}})"),
      InvalidArgument);
  EXPECT_THROW(RdzvEvent::deserialize(R"({"name": "x"})"), InvalidArgument);
}

TEST(EventsTest, TheJsonLinesHandlerAppendsOneEventPerLine) {
  auto path = std::filesystem::temp_directory_path() /
              ("tide_events_" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(path);
  configure(std::make_shared<JsonLinesEventHandler>(path.string()));
  EXPECT_TRUE(enabled());
  record(Event{.name = "a"});
  record_rdzv_event(RdzvEvent{.name = "b", .run_id = "r"});
  configure(nullptr);
  EXPECT_FALSE(enabled());
  record(Event{.name = "dropped"});
  std::ifstream in(path);
  std::string first;
  std::string second;
  std::getline(in, first);
  std::getline(in, second);
  EXPECT_EQ(Event::deserialize(first).name, "a");
  EXPECT_GT(Event::deserialize(first).timestamp, 0);
  EXPECT_NE(second.find("\"event_type\":\"rdzv\""), std::string::npos);
  EXPECT_EQ(RdzvEvent::deserialize(second).pid, ::getpid());
  std::string third;
  EXPECT_FALSE(std::getline(in, third));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace tide::events
