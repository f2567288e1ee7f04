#pragma once

#include <string>

#include "rpc_core/peer_group.h"
#include "transport/transport.h"

// What worker `rank` published in the rpc group's store: for tests that
// reach a worker by hand.
namespace tide::test {

template <typename Store>
transport::PeerAddress published_entry(Store& store, int rank) {
  auto raw = store.get(rpc_core::peer_key(rank));
  return rpc_core::decode_peer(rank, std::string(raw.begin(), raw.end()));
}

}  // namespace tide::test
