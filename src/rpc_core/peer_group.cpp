#include "rpc_core/peer_group.h"

#include <map>

#include "tide/common/error.h"

#include "transport/fields.h"

namespace tide::rpc_core {

namespace {

constexpr std::string_view kPrefix = "tide/rpc/";

std::string key(std::string_view k) {
  return std::string(kPrefix) + std::string(k);
}

}  // namespace

std::string peer_key(int rank) {
  return key("workers/" + std::to_string(rank));
}

std::string encode_peer(const transport::PeerAddress& a) {
  return transport::FieldWriter()
      .i32(a.id)
      .str(a.name)
      .str(a.host)
      .u32(a.port)
      .str(a.host_key)
      .str(a.local_name)
      .take();
}

transport::PeerAddress decode_peer(int rank, std::string_view entry) {
  transport::FieldReader r(entry, "an rpc worker's entry in the store");
  transport::PeerAddress a;
  a.id = r.i32();
  a.name = r.str();
  a.host = r.str();
  uint32_t port = r.u32();
  a.host_key = r.str();
  a.local_name = r.str();
  r.end();
  if (a.id != rank || port > 65535 || a.name.empty()) {
    throw ProtocolError(
        "the entry under " + peer_key(rank) + " is not a worker's of rank " +
        std::to_string(rank) + " (rank " + std::to_string(a.id) + ", port " +
        std::to_string(port) + ", name '" + a.name + "')");
  }
  a.port = static_cast<uint16_t>(port);
  return a;
}

std::vector<transport::PeerAddress> meet(
    GroupStore& store,
    const transport::PeerAddress& me,
    int world_size,
    std::chrono::milliseconds timeout) {
  if (me.id < 0 || me.id >= world_size) {
    throw InvalidArgument(
        "rank " + std::to_string(me.id) + " is outside world_size " +
        std::to_string(world_size));
  }
  std::string ws = std::to_string(world_size);
  std::string agreed = store.compare_set(key("world_size"), "", ws);
  if (agreed != ws) {
    throw InvalidArgument(
        "worker '" + me.name + "' has world_size " + ws +
        " but the group was started with world_size " + agreed +
        "; every worker must pass the same world_size");
  }
  std::string rank = std::to_string(me.id);
  std::string owner = store.compare_set(key("names/" + me.name), "", rank);
  if (owner != rank) {
    // Published all the same: the rank holding the name completes its
    // group and learns of the duplicate too, instead of timing out.
    store.set(peer_key(me.id), encode_peer(me));
    throw InvalidArgument(
        "worker name '" + me.name + "' is taken by rank " + owner +
        " (this is rank " + rank +
        "): the name is not unique; every worker needs a unique name");
  }
  store.set(peer_key(me.id), encode_peer(me));
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) {
    keys.push_back(peer_key(r));
  }
  std::vector<std::string> values;
  try {
    store.wait(keys, timeout);
    values = store.multi_get(keys);
  } catch (const TimeoutError& e) {
    throw RendezvousError(
        "rpc group of " + ws + " workers did not complete within " +
        std::to_string(timeout.count()) + " ms (" + e.what() + ")");
  }
  std::vector<transport::PeerAddress> peers;
  std::map<std::string, int> ranks;
  for (int r = 0; r < world_size; ++r) {
    auto p = decode_peer(r, values[static_cast<size_t>(r)]);
    auto [it, fresh] = ranks.emplace(p.name, r);
    if (!fresh) {
      throw InvalidArgument(
          "rpc worker name '" + p.name + "' is not unique: ranks " +
          std::to_string(it->second) + " and " + std::to_string(r) +
          " share it");
    }
    peers.push_back(std::move(p));
  }
  return peers;
}

int64_t GroupBarrier::sum(int64_t count, std::chrono::milliseconds timeout) {
  std::string prefix = key("round/" + std::to_string(round_++) + "/");
  store_.add(prefix + "count", count);
  if (store_.add(prefix + "arrived", 1) == world_size_) {
    store_.set(prefix + "done", "1");
  }
  store_.wait({prefix + "done"}, timeout);
  return store_.add(prefix + "count", 0);
}

void GroupBarrier::drain(
    const std::function<void()>& wait_idle,
    const std::function<int64_t()>& in_flight,
    std::chrono::milliseconds timeout) {
  for (;;) {
    wait_idle();
    sum(0, timeout);
    if (sum(in_flight(), timeout) == 0) {
      return;
    }
  }
}

void GroupBarrier::leave(bool last, std::chrono::milliseconds timeout) {
  if (store_.add(key("left"), 1) == world_size_) {
    store_.set(key("all_left"), "1");
  }
  if (last) {
    store_.wait({key("all_left")}, timeout);
  }
}

}  // namespace tide::rpc_core
