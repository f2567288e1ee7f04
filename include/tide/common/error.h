#pragma once

#include <stdexcept>
#include <string>

// tide's exception hierarchy. The type tells the caller what to do; the
// message says what was expected, what came, and what to do about it.
namespace tide {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A deadline passed. The operation may still have happened.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The peer was lost (refused, reset, closed). Reconnect and retry the call.
class NetworkError : public Error {
 public:
  using Error::Error;
};

// A frame or value broke the protocol. Drop the connection.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// The caller passed something that can never work. Never retry.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A rendezvous round failed; redo the rendezvous.
class RendezvousError : public Error {
 public:
  using Error::Error;
};

// The job is over; stop.
class RendezvousClosedError : public RendezvousError {
 public:
  using RendezvousError::RendezvousError;
};

// A round did not complete in time (join_timeout).
class RendezvousTimeoutError : public RendezvousError {
 public:
  using RendezvousError::RendezvousError;
};

// The rendezvous' store or server cannot be reached.
class RendezvousConnectionError : public RendezvousError {
 public:
  using RendezvousError::RendezvousError;
};

// The shared rendezvous state is malformed (another program, another
// version) and cannot be used.
class RendezvousStateError : public RendezvousError {
 public:
  using RendezvousError::RendezvousError;
};

// Thrown on a remote peer; the message carries its type and text.
class RemoteError : public Error {
 public:
  using Error::Error;
};

// A broken invariant inside tide: a bug.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void check_failed(const char* cond, const char* file, int line);
}  // namespace detail

}  // namespace tide

#define TIDE_CHECK(cond)                                       \
  do {                                                         \
    if (!(cond)) {                                             \
      ::tide::detail::check_failed(#cond, __FILE__, __LINE__); \
    }                                                          \
  } while (false)

#ifdef NDEBUG
#define TIDE_DCHECK(cond) \
  do {                    \
  } while (false && (cond))
#else
#define TIDE_DCHECK(cond) TIDE_CHECK(cond)
#endif
