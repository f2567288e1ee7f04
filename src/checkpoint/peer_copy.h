#pragma once

// The copy of a node's snapshots on another node (docs/checkpoints.md, "A
// copy on a peer node"): each node's agent serves its region over tide's
// transport (TCP, with lanes for large snapshots) and copies its own ranks'
// newest snapshots, as workers save them, into the replica slots of one
// other node's region (its peer). A node that starts without the snapshots
// of its ranks (a replacement for a lost node, or ranks moved by an elastic
// change) fetches them from the nodes that hold them before its workers
// start.
//
// On the wire, one message per chunk of a snapshot (chunk_bytes at most),
// acknowledged one by one, at most kWindow unacknowledged; the receiver
// writes each into its slot as it comes, the slot marked "being written"
// until the last, so a copy cut short is never loaded.
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tide::checkpoint {

class Region;

inline constexpr int kWindow = 8;

struct PeerCopyOptions {
  std::string listen_host = "0.0.0.0";
  // The job's secret: only an agent that proves it connects.
  std::string token;
  // A snapshot travels in messages of this many bytes at most.
  uint64_t chunk_bytes = uint64_t{8} << 20;
  // How long a chunk's acknowledgement, or a whole fetch, may take.
  std::chrono::milliseconds timeout{60'000};
};

// An agent of the round, as the peer copy reaches it.
struct PeerNode {
  int rank = 0;  // among the round's agents
  int id = 0;    // its PeerCopy's id()
  std::string host;
  uint16_t port = 0;
};

// What a fetch brought: a rank's snapshots, from which node.
struct Fetched {
  int64_t rank = 0;
  int from = -1;
  std::vector<int64_t> steps;  // newest first
  uint64_t bytes = 0;
};

struct FetchResult {
  std::vector<Fetched> got;
  std::string error;  // "" when every agent sent all it holds
};

class PeerCopy {
 public:
  // Listens at once. Throws NetworkError when it cannot bind.
  PeerCopy(Region& region, PeerCopyOptions options);
  ~PeerCopy();
  PeerCopy(const PeerCopy&) = delete;
  PeerCopy& operator=(const PeerCopy&) = delete;

  uint16_t port() const;
  // This agent's id on the transport: random, never an old agent's.
  int id() const;

  // The round's agents (this one's rank is `self`) and the one that takes
  // this node's copies (-1: none, and saves stop waiting for one).
  void set_round(int self, std::vector<PeerNode> nodes, int peer);

  // Fetches from the round's other agents every snapshot they hold of
  // `ranks` (global rank -> this node's local rank), newest first, into
  // those local ranks' own slots; waits for each agent to answer (or the
  // timeout). Returns what came, rank by rank (ranks none held are
  // absent), and what did not: an agent that cannot be reached or does not
  // answer, a snapshot that could not be sent whole.
  FetchResult fetch(const std::map<int64_t, int>& ranks);

  struct Stats {
    uint64_t copies = 0;  // snapshots the peer took
    uint64_t bytes_copied = 0;
  };
  Stats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tide::checkpoint
