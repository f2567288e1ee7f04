#pragma once

#include <string>
#include <tuple>

#include "tide/rpc/serialize.h"

#include "transport/transport.h"

// A worker's entry in the rpc store ("rpc/workers/<rank>"), as the C++
// agent publishes it: for tests that reach a worker by hand.
namespace tide::test {

inline transport::PeerAddress decode_rpc_entry(const std::string& entry) {
  rpc::Decoder d(entry);
  auto [name, id, host, port, host_key, local_name] = rpc::decode_args<
      std::tuple<std::string, int, std::string, int, std::string, std::string>>(
      d, "entry");
  return {id, name, host, static_cast<uint16_t>(port), host_key, local_name};
}

}  // namespace tide::test
