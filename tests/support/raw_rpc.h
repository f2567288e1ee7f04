#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

#include "transport/auth.h"
#include "transport/control.h"
#include "transport/fields.h"
#include "transport/frame.h"

// tide's transport handshake played by hand (transport/control.h,
// transport/auth.h), for tests that act as a peer: a caller, a callee, or a
// stranger that gets some of it wrong.
namespace tide::test {

inline std::string hello_frame(
    int id,
    const std::string& name,
    const std::string& nonce,
    bool has_token,
    uint32_t features = 0) {
  return transport::encode(
      {.type = transport::ControlType::kHandshake,
       .metadata = transport::FieldWriter()
                       .i32(id)
                       .str(name)
                       .u32(features)
                       .str(nonce)
                       .u32(has_token ? 1 : 0)
                       .take()});
}

inline std::string proof_frame(const std::string& proof) {
  return transport::encode(
      {.type = transport::ControlType::kProof,
       .metadata = transport::FieldWriter().str(proof).take()});
}

// One frame of the transport's own types read from fd, a byte at a time (so
// nothing after it is taken); nullopt when the peer closed first. Throws on
// timeout or a malformed frame.
inline std::optional<transport::Frame> read_control_frame(
    int fd, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  transport::FrameDecoder d(transport::control_types());
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (left.count() <= 0 ||
        ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      throw std::runtime_error("read_control_frame: timed out");
    }
    char c = 0;
    ssize_t k = ::recv(fd, &c, 1, 0);
    if (k <= 0) {
      return std::nullopt;
    }
    d.feed(&c, 1);
    if (auto f = d.next()) {
      return f;
    }
  }
}

// The caller's side on a connected socket: HANDSHAKE (through `send`, which
// may add descriptors), the callee's ack, whose proof must hold, and PROOF.
// Returns the session (lanes prove themselves with it). Throws
// std::runtime_error naming what went wrong (a refusal's message, a close,
// a proof that fails).
inline transport::auth::Session handshake_as_caller(
    int fd,
    const std::function<void(const std::string&)>& send,
    int id,
    const std::string& name,
    const std::string& token,
    uint32_t features = 0) {
  using namespace transport;
  auth::Session s{auth::nonce(), "", id, 0};
  send(hello_frame(id, name, s.caller_nonce, !token.empty(), features));
  auto f = read_control_frame(fd);
  if (!f) {
    throw std::runtime_error("closed instead of an ack");
  }
  if (f->type == ControlType::kRefused) {
    FieldReader r(f->metadata, "a refusal");
    r.str();
    throw std::runtime_error("refused: " + r.str());
  }
  if (f->type != ControlType::kHandshakeAck) {
    throw std::runtime_error("not an ack");
  }
  FieldReader r(f->metadata, "an ack");
  s.callee_id = r.i32();
  r.str();
  r.u32();
  s.callee_nonce = r.str();
  if (!auth::verify(token, auth::Role::kCallee, s, r.str())) {
    throw std::runtime_error("the callee's proof does not hold");
  }
  send(proof_frame(auth::proof(token, auth::Role::kCaller, s)));
  return s;
}

// The callee's side on an accepted socket: the caller's HANDSHAKE, an ack
// with this side's proof keyed by `token` (right or wrong), and, when
// `expect_proof`, the caller's PROOF. Returns the session.
inline transport::auth::Session handshake_as_callee(
    int fd, int self_id, const std::string& token, bool expect_proof = true) {
  using namespace transport;
  auto hello = read_control_frame(fd);
  if (!hello || hello->type != ControlType::kHandshake) {
    throw std::runtime_error("no HANDSHAKE");
  }
  FieldReader r(hello->metadata, "a handshake");
  auth::Session s;
  s.caller_id = r.i32();
  r.str();
  r.u32();
  s.caller_nonce = r.str();
  s.callee_nonce = auth::nonce();
  s.callee_id = self_id;
  std::string ack = encode(
      {.type = ControlType::kHandshakeAck,
       .metadata = FieldWriter()
                       .i32(self_id)
                       .str("raw")
                       .u32(0)
                       .str(s.callee_nonce)
                       .str(auth::proof(token, auth::Role::kCallee, s))
                       .take()});
  if (::send(fd, ack.data(), ack.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(ack.size())) {
    throw std::runtime_error("could not send the ack");
  }
  if (expect_proof) {
    auto proof = read_control_frame(fd);
    if (!proof || proof->type != ControlType::kProof) {
      throw std::runtime_error("no PROOF");
    }
  }
  return s;
}

}  // namespace tide::test
