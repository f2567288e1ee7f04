#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <thread>

#include "store/wire.h"
#include "support/raw_client.h"

// torch's TCPStore server as far as tide's own commands go: it takes one
// connection, answers the modern handshake (VALIDATE, PING) and closes the
// connection at any other command, as torch's server does at one it does
// not know.
namespace tide::test {

class TorchStoreStandIn {
 public:
  TorchStoreStandIn() : listener_(listen_on_loopback(&port_)) {
    thread_ = std::jthread([this] { serve_one(); });
  }
  ~TorchStoreStandIn() {
    ::shutdown(listener_, SHUT_RDWR);  // ends an accept nobody answered
    thread_.join();
    ::close(listener_);
  }
  TorchStoreStandIn(const TorchStoreStandIn&) = delete;
  TorchStoreStandIn& operator=(const TorchStoreStandIn&) = delete;

  uint16_t port() const {
    return port_;
  }

 private:
  void serve_one() {
    int fd = ::accept(listener_, nullptr, nullptr);
    if (fd < 0) {
      return;
    }
    using store::wire::Op;
    auto code_of = [](Op op) {
      return *store::wire::op_code(op, store::Dialect::kModern);
    };
    uint8_t code = 0;
    uint32_t number = 0;
    while (::recv(fd, &code, 1, MSG_WAITALL) == 1 &&
           (code == code_of(Op::kValidate) || code == code_of(Op::kPing)) &&
           ::recv(fd, &number, sizeof number, MSG_WAITALL) == sizeof number) {
      if (code == code_of(Op::kPing)) {
        ::send(fd, &number, sizeof number, MSG_NOSIGNAL);
      }
    }
    ::close(fd);
  }

  uint16_t port_ = 0;
  int listener_;
  std::jthread thread_;
};

}  // namespace tide::test
