#include "rendezvous/dynamic_records.h"

#include <nlohmann/json.hpp>

namespace tide::rendezvous::detail {

namespace {

using nlohmann::json;

constexpr const char* kStateSchema = "tide.rendezvous/1";

}  // namespace

std::string encode_state(const std::string& run_id, const JobState& s) {
  return json{
      {"schema", kStateSchema},
      {"run_id", run_id},
      {"round", s.round},
      {"closed", s.closed},
      {"failed", s.failed}}
      .dump();
}

JobState decode_state(const std::string& run_id, const std::string& text) {
  auto bad = [&](const std::string& why) {
    return RendezvousStateError(
        "the rendezvous record of run \"" + run_id +
        "\" is not usable: " + why + " (record: " + text.substr(0, 200) +
        "); another program or tide version may use this run id; pick "
        "another --rdzv-id");
  };
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    throw bad("not a JSON object");
  }
  auto text_field = [&](const char* name) {
    auto it = j.find(name);
    return it != j.end() && it->is_string() ? it->get<std::string>()
                                            : std::string();
  };
  if (text_field("schema") != kStateSchema) {
    throw bad(std::string("schema is not \"") + kStateSchema + "\"");
  }
  if (text_field("run_id") != run_id) {
    throw bad("it belongs to another run");
  }
  auto round = j.find("round");
  auto closed = j.find("closed");
  if (round == j.end() || !round->is_number_integer() ||
      round->get<int64_t>() < 0) {
    throw bad("\"round\" is not a non-negative integer");
  }
  auto failed = j.find("failed");
  if (closed == j.end() || !closed->is_boolean() ||
      (failed != j.end() && !failed->is_boolean())) {
    throw bad("\"closed\" or \"failed\" is not a boolean");
  }
  return JobState{
      .round = round->get<int64_t>(),
      .closed = closed->get<bool>(),
      .failed = failed != j.end() && failed->get<bool>()};
}

std::string encode_size(int64_t size, const NodeDesc& by) {
  return json{{"size", size}, {"closed_by", by.to_string()}}.dump();
}

int64_t decode_size(int64_t round, const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("size") || !j["size"].is_number_integer() ||
      j["size"].get<int64_t>() < 1) {
    throw RendezvousStateError(
        "round " + std::to_string(round) +
        " has a malformed size record: " + text.substr(0, 200));
  }
  return j["size"].get<int64_t>();
}

std::string encode_master(const std::string& addr, uint16_t port) {
  return json{{"addr", addr}, {"port", port}}.dump();
}

BootstrapStoreInfo decode_master(int64_t round, const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("addr") || !j["addr"].is_string() ||
      !j.contains("port") || !j["port"].is_number_unsigned() ||
      j["port"].get<uint64_t>() == 0 || j["port"].get<uint64_t>() > 65535) {
    throw RendezvousStateError(
        "round " + std::to_string(round) +
        " has a malformed master record: " + text.substr(0, 200));
  }
  return BootstrapStoreInfo{
      .master_addr = j["addr"].get<std::string>(),
      .master_port = static_cast<uint16_t>(j["port"].get<uint64_t>())};
}

}  // namespace tide::rendezvous::detail
