#pragma once

#include <cstdint>
#include <string>
#include <string_view>

// How the two ends of a connection prove to each other that they hold the
// group's secret (TransportOptions::token) without sending it:
// challenge-response with HMAC-SHA256 (OpenSSL's) over both sides' fresh
// nonces and both worker ids. Each proof names its role, so one side's proof
// is never valid as the other's, and the nonces make every connection's
// proofs new, so a recorded handshake replays nowhere. With no secret the
// proofs are keyed by the empty string: they still bind a lane to its
// connection (only the two ends saw the callee's nonce), and nothing else.
//
// The exchange (transport/control.h):
//   caller -> callee  HANDSHAKE      caller id, nonce_c
//   callee -> caller  HANDSHAKE_ACK  callee id, nonce_s, proof(kCallee)
//   caller -> callee  PROOF          proof(kCaller)   then its requests
//   caller -> callee  LANE_HELLO     on a new socket: proof(kLane, index)
// The caller checks the callee's proof before it sends anything of the layer
// above; the callee serves nothing before the caller's proof.
namespace tide::transport::auth {

constexpr size_t kNonceSize = 32;

// kNonceSize random bytes from the system's CSPRNG.
std::string nonce();

enum class Role : uint8_t { kCallee = 1, kCaller = 2, kLane = 3 };

// What a connection's proofs cover.
struct Session {
  std::string caller_nonce;
  std::string callee_nonce;
  int32_t caller_id = 0;
  int32_t callee_id = 0;
};

// The proof of `role` (32 bytes); `lane` is the lane's index for kLane.
std::string proof(
    std::string_view secret,
    Role role,
    const Session& session,
    uint32_t lane = 0);

// Whether `claimed` is that proof, compared in constant time.
bool verify(
    std::string_view secret,
    Role role,
    const Session& session,
    std::string_view claimed,
    uint32_t lane = 0);

}  // namespace tide::transport::auth
