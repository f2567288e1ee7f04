#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "transport/transport.h"

// The group of rpc workers, as both front ends meet it through a store:
// each claims its name and the group's size, publishes where it listens,
// and reads everyone's entry; at the end they drain and leave together.
// All keys live under "tide/rpc/":
//
//   world_size          the group's size; the first worker sets it
//   names/<name>        the rank that claimed <name>
//   workers/<rank>      the entry of worker <rank> (encode_peer)
//   round/<n>/...       round n of the group's barrier (GroupBarrier)
//   left, all_left      who has left (GroupBarrier::leave)
//
// docs/rpc-protocol.md, "The group in the store", says the same.
namespace tide::rpc_core {

// The five operations of a store the group needs: each front end adapts its
// own (tide's Store, torch's c10d::Store). Errors: TimeoutError from wait;
// others as the store throws them.
class GroupStore {
 public:
  virtual ~GroupStore() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value now under `key`: `desired` when it held `expected` (""
  // standing for no key), else the value it held.
  virtual std::string compare_set(
      const std::string& key,
      const std::string& expected,
      const std::string& desired) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Throws TimeoutError when a key is still missing after `timeout`.
  virtual void wait(
      const std::vector<std::string>& keys,
      std::chrono::milliseconds timeout) = 0;
  virtual std::vector<std::string> multi_get(
      const std::vector<std::string>& keys) = 0;
};

// The store key of worker `rank`'s entry.
std::string peer_key(int rank);
// A worker's entry: its rank, name and where it listens, as transport
// fields (transport/fields.h).
std::string encode_peer(const transport::PeerAddress& address);
// Throws ProtocolError for an entry that does not parse or is not `rank`'s.
transport::PeerAddress decode_peer(int rank, std::string_view entry);

// Meets the group: `me` (its id is this worker's rank, its name its name)
// claims its name and world_size, publishes its entry and waits, up to
// `timeout`, for all world_size entries; returns them by rank. Throws
// InvalidArgument for a rank outside the group, a world_size other than
// the group's, or a name another rank holds (published all the same, so
// that every rank of the group fails naming the duplicate); RendezvousError
// when the group is incomplete after `timeout`.
std::vector<transport::PeerAddress> meet(
    GroupStore& store,
    const transport::PeerAddress& me,
    int world_size,
    std::chrono::milliseconds timeout);

// The group's barrier: rounds in which every worker adds a count and all
// learn the sum. Every worker makes the same calls in the same order (a
// round is its position in that sequence). Not thread safe: one caller.
class GroupBarrier {
 public:
  GroupBarrier(GroupStore& store, int world_size)
      : store_(store), world_size_(world_size) {}

  // One round: adds `count`, returns the group's sum once all have added.
  // Throws TimeoutError after `timeout`.
  int64_t sum(int64_t count, std::chrono::milliseconds timeout);
  // Returns once no worker has work in flight, nested work included: each
  // round, every worker waits until its own work is done (wait_idle), all
  // meet, then sum what each has in flight again (in_flight: work that came
  // meanwhile), until a round sums zero.
  void drain(
      const std::function<void()>& wait_idle,
      const std::function<int64_t()>& in_flight,
      std::chrono::milliseconds timeout);
  // This worker leaves the group's store; with `last`, it waits until all
  // have left first (the worker hosting the store).
  void leave(bool last, std::chrono::milliseconds timeout);

 private:
  GroupStore& store_;
  const int world_size_;
  int round_ = 0;
};

}  // namespace tide::rpc_core
