#pragma once

#include <cstdint>
#include <string>
#include <string_view>

// Where the c10d backend keeps a job's rendezvous in the store; shared with
// bench/scale's simulated agents, which must use the same keys.
namespace tide::rendezvous {

// Keys, all under "tide.rdzv/<run_id>/":
//   state                the job record (JSON, compare-and-set)
//   r<R>/count           arrivals of round R (add)
//   r<R>/node/<i>        arrival i's descriptor (JSON)
//   r<R>/v/<name>        write-once values: last_call, size, master
//   r<R>/hb/<i>          arrival i's heartbeat counter
//   r<R>/left/<i>        arrival i finished
//   r<R>/agents/...      the round's store for the agents
//   status/...           the agents' status records (status/job_status.h)
class StoreKeys {
 public:
  explicit StoreKeys(const std::string& run_id)
      : base_("tide.rdzv/" + run_id + "/") {}
  std::string state() const {
    return base_ + "state";
  }
  // The prefix of the job's status store (PrefixStore adds the '/').
  std::string status() const {
    return base_ + "status";
  }
  std::string round(int64_t r, const std::string& rest) const {
    return base_ + "r" + std::to_string(r) + "/" + rest;
  }
  std::string count(int64_t r) const {
    return round(r, "count");
  }
  std::string node(int64_t r, int64_t i) const {
    return round(r, "node/" + std::to_string(i));
  }
  std::string value(int64_t r, const std::string& name) const {
    return round(r, "v/" + name);
  }
  std::string heartbeat(int64_t r, int64_t i) const {
    return round(r, "hb/" + std::to_string(i));
  }
  std::string left(int64_t r, int64_t i) const {
    return round(r, "left/" + std::to_string(i));
  }

 private:
  std::string base_;
};

// A value no record holds: compare_set(key, kAbsent, kAbsent) reads a key in
// one request, writing nothing (see value_if_set in c10d_rendezvous.cpp).
constexpr std::string_view kAbsent = "\x01tide.absent";

}  // namespace tide::rendezvous
