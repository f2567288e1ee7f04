#pragma once

// Healing's wire (docs/fault_tolerance.md#one-step): an up-to-date rank
// sends its state to a rank that heals from it over tide's transport, so
// that the bytes go over TCP (also on one host: each lands in the healer's
// own tensor, where shared memory would be new pages to fault in), tensors
// as raw buffers beside a description of them (tide.ft's JSON; nothing
// pickled).
//
// Each process of a replica group has one StateTransfer. The healer
// publishes its address(); the source send()s the state to it: first its
// description, which the healer's receive_meta() returns; the healer then
// says where each tensor goes (receive_into(): its own tensors, so nothing
// new is allocated or copied twice), and the bytes land there. send()
// returns once the healer has them all.
//
// Thread safety: every method is thread safe. Errors: TimeoutError (no
// state, or no acknowledgement, in time), NetworkError (the peer is gone:
// a source dying midway), ProtocolError (a message tide would not send),
// InvalidArgument (a copy of the wrong size, a bad address).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tide/common/buffer.h"

namespace tide::ft {

using std::chrono::milliseconds;

class StateTransfer {
 public:
  // Listens on `listen_host` (and, for peers of this host, a Unix socket
  // and shared memory). `token`: the job's secret (TIDE_RPC_TOKEN), or
  // empty (then only this user's processes are let in).
  StateTransfer(const std::string& listen_host, const std::string& token);
  ~StateTransfer();

  StateTransfer(const StateTransfer&) = delete;
  StateTransfer& operator=(const StateTransfer&) = delete;

  // Where this process is reached, as a string for a store.
  std::string address() const;

  // Sends `meta` and the bytes at `buffers` (borrowed: they must stay
  // unchanged until this returns) to the process at `to`, tagged `tag`,
  // and waits until it has them all.
  void send(
      const std::string& to,
      uint64_t tag,
      const std::string& meta,
      const std::vector<std::pair<const void*, size_t>>& buffers,
      milliseconds timeout);

  // Waits for the state tagged `tag` and returns its description (states
  // with lower tags, of rounds that were aborted, are dropped).
  std::string receive_meta(uint64_t tag, milliseconds timeout);
  // Then: receives its tensors' bytes straight into `targets` (one per
  // tensor, each of exactly its size), and returns once all are in. When
  // it throws (the source gone, a timeout) some targets may be half
  // written, and this StateTransfer is closed (nothing more can land).
  void receive_into(
      uint64_t tag,
      const std::vector<std::pair<void*, size_t>>& targets,
      milliseconds timeout);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tide::ft
