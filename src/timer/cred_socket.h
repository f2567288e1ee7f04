#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <string_view>

#include "tide/common/fd.h"

// Unix datagram sockets whose receiver learns each sender's pid from the
// kernel (SCM_CREDENTIALS): the local timers' and the heartbeats' channel.
// Private to the timer part.
namespace tide::timer::detail {

// Binds a non-blocking datagram socket at `path` with SO_PASSCRED (a stale
// socket there is replaced). `what` names the socket in errors. Throws
// InvalidArgument for a path over 107 bytes, Error when it cannot be bound.
Fd bind_credential_socket(const std::string& path, const char* what);

// A datagram socket connected to `path`; -1 (errno set) when nothing
// listens there. Throws InvalidArgument for a path over 107 bytes.
Fd connect_datagram_socket(const std::string& path, const char* what);

// Reads every datagram queued on `fd` without blocking and calls
// on_datagram(sender pid, bytes) for each one of at most max_len bytes
// that came with credentials; the others are skipped and logged as
// malformed.
void receive_with_credentials(
    int fd,
    size_t max_len,
    const char* what,
    const std::function<void(pid_t, std::string_view)>& on_datagram);

}  // namespace tide::timer::detail
