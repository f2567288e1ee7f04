#include "store/mux_connection.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "tide/common/error.h"
#include "tide/common/logging.h"

#include "common/clock.h"
#include "net/address.h"
#include "net/socket.h"

namespace tide::store::detail {

namespace {

void await(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{.fd = fd, .events = events, .revents = 0};
    int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r > 0) {
      return;
    }
    if (r == 0) {
      throw TimeoutError("no progress in time");
    }
    if (errno != EINTR) {
      throw NetworkError(std::string("poll: ") + std::strerror(errno));
    }
  }
}

void send_all(int fd, std::string_view bytes, Clock::time_point deadline) {
  while (!bytes.empty()) {
    ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      await(fd, POLLOUT, deadline);
    } else if (n < 0 && errno != EINTR) {
      throw NetworkError(std::string("send: ") + std::strerror(errno));
    }
  }
}

std::string recv_exact(int fd, size_t len, Clock::time_point deadline) {
  std::string out(len, '\0');
  size_t got = 0;
  while (got < len) {
    ssize_t n = ::recv(fd, out.data() + got, len - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n == 0) {
      throw NetworkError("the store closed the connection");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      await(fd, POLLIN, deadline);
    } else if (errno != EINTR) {
      throw NetworkError(std::string("recv: ") + std::strerror(errno));
    }
  }
  return out;
}

}  // namespace

Fd connect_tagged(
    const MuxEndpoint& endpoint, Clock::time_point deadline, bool retry) {
  std::string where = net::format_host_port(endpoint.host, endpoint.port);
  std::string error;
  auto backoff = milliseconds(10);
  std::minstd_rand jitter(static_cast<unsigned>(::getpid()));
  Fd fd;
  for (;;) {
    fd = net::connect_tcp(endpoint.host, endpoint.port, deadline, error);
    if (fd || !retry || Clock::now() >= deadline) {
      break;
    }
    auto pause = std::min<milliseconds>(
        backoff + milliseconds(jitter() % 10),
        std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
    std::this_thread::sleep_for(pause);
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
  if (!fd && !retry) {
    throw NetworkError(
        "the connection to the store at " + where +
        " was lost and it cannot be reached again: " + error);
  }
  if (!fd) {
    throw TimeoutError(
        "cannot connect to the store at " + where + " within " +
        std::to_string(endpoint.connect_timeout.count()) + " ms: " + error);
  }
  try {
    if (!endpoint.token.empty()) {
      std::string auth;
      wire::Writer(auth).u8(wire::kAuthCode).str(endpoint.token);
      send_all(fd.get(), auth, deadline);
      try {
        recv_exact(fd.get(), 1, deadline);
      } catch (const NetworkError&) {
        throw NetworkError(
            "the store at " + where + " refused this client's token");
      }
    }
    // VALIDATE, then a tagged PING: a store that is not tide's closes the
    // connection at the frame.
    uint32_t nonce = static_cast<uint32_t>(::getpid());
    std::string hello;
    wire::encode_request(
        {.op = wire::Op::kValidate, .number = wire::kValidateMagic},
        Dialect::kModern,
        hello);
    wire::Tagged zero;
    wire::encode_request(
        {.op = wire::Op::kPing, .number = nonce},
        Dialect::kModern,
        hello,
        &zero);
    send_all(fd.get(), hello, deadline);
    std::string reply;
    try {
      reply =
          recv_exact(fd.get(), sizeof(uint64_t) + sizeof(uint32_t), deadline);
    } catch (const NetworkError&) {
      throw NetworkError(
          "the store at " + where +
          " closed the connection at a tagged frame: a connection shared "
          "by many callers needs a tide store (tide-store, or a tide "
          "agent's), not torch's");
    }
    if (wire::load<uint64_t>(reply.data()) != 0 ||
        wire::load<uint32_t>(reply.data() + sizeof(uint64_t)) != nonce) {
      throw ProtocolError(
          "the store at " + where + " answered a tagged PING wrongly");
    }
  } catch (const TimeoutError& e) {
    throw TimeoutError("connecting to the store at " + where + ": " + e.what());
  }
  return fd;
}

MuxConnection::MuxConnection(MuxEndpoint endpoint)
    : endpoint_(std::move(endpoint)),
      where_(net::format_host_port(endpoint_.host, endpoint_.port)) {}

MuxConnection::~MuxConnection() {
  std::unique_lock lock(mutex_);
  closing_ = true;
  if (fd_) {
    ::shutdown(fd_->get(), SHUT_RDWR);
  }
  std::thread reader = std::move(reader_);
  auto pending = std::move(pending_);
  lock.unlock();
  if (reader.joinable()) {
    if (reader.get_id() == std::this_thread::get_id()) {
      reader.detach();  // the last owner let go in a callback
    } else {
      reader.join();
    }
  }
  auto error = std::make_exception_ptr(
      NetworkError("the connection to the store at " + where_ + " closed"));
  for (auto& [tag, p] : pending) {
    wire::Reply none;
    p.done(error, none);
  }
}

void MuxConnection::connect() {
  std::lock_guard write(write_mutex_);
  std::unique_lock lock(mutex_);
  if (!fd_) {
    open_locked(lock, Clock::now() + endpoint_.connect_timeout, true);
  }
}

void MuxConnection::open_locked(
    std::unique_lock<std::mutex>& lock,
    Clock::time_point deadline,
    bool retry) {
  if (reader_.joinable()) {
    std::thread old = std::move(reader_);
    if (old.get_id() == std::this_thread::get_id()) {
      old.detach();  // it ends once this callback returns: its generation is
                     // gone
    } else {
      lock.unlock();
      old.join();
      lock.lock();
    }
  }
  Fd fd = connect_tagged(endpoint_, deadline, retry);
  fd_ = std::make_shared<Fd>(std::move(fd));
  last_heard_ = Clock::now().time_since_epoch().count();
  ++generation_;
  reader_ =
      std::thread([this, fd = fd_, g = generation_] { read_loop(fd, g); });
}

void MuxConnection::submit(
    const wire::Request& req,
    uint64_t wait_ms,
    Done done,
    Clock::time_point deadline) {
  std::vector<Submission> one;
  one.push_back({req, wait_ms, std::move(done)});
  submit_all(std::move(one), deadline);
}

void MuxConnection::submit_all(
    std::vector<Submission> all, Clock::time_point deadline) {
  std::string frames;
  std::vector<uint64_t> tags;
  std::shared_ptr<Fd> fd;
  std::lock_guard write(write_mutex_);
  {
    std::unique_lock lock(mutex_);
    if (closing_) {
      throw NetworkError("the connection to the store is closing");
    }
    if (!fd_) {
      open_locked(lock, deadline, false);
    }
    fd = fd_;
    for (Submission& s : all) {
      wire::Tagged tag{.tag = next_tag_++, .wait_ms = s.wait_ms};
      wire::encode_request(s.req, Dialect::kModern, frames, &tag);
      if (wire::has_reply(s.req.op)) {
        pending_.emplace(tag.tag, Pending{s.req, std::move(s.done)});
        tags.push_back(tag.tag);
      }
    }
  }
  try {
    send_all(fd->get(), frames, deadline);
  } catch (const Error& e) {
    {
      std::lock_guard lock(mutex_);
      for (uint64_t t : tags) {
        pending_.erase(t);
      }
    }
    std::string why = std::string("sending to the store at ") + where_ +
                      " failed: " + e.what();
    reset(why);
    throw NetworkError(why);
  }
}

void MuxConnection::reset(const std::string& why) {
  uint64_t g = 0;
  {
    std::lock_guard lock(mutex_);
    g = generation_;
  }
  fail(g, why);
}

size_t MuxConnection::pending() const {
  std::lock_guard lock(mutex_);
  return pending_.size();
}

void MuxConnection::fail(uint64_t generation, const std::string& why) {
  std::unordered_map<uint64_t, Pending> failed;
  {
    std::lock_guard lock(mutex_);
    if (generation != generation_ || !fd_) {
      return;
    }
    ::shutdown(fd_->get(), SHUT_RDWR);  // wakes its reader
    fd_.reset();
    failed.swap(pending_);
  }
  if (!failed.empty()) {
    TIDE_LOG_DEBUG(
        "[store] connection to {} lost with {} requests in flight: {}",
        where_,
        failed.size(),
        why);
  }
  auto error = std::make_exception_ptr(NetworkError(why));
  for (auto& [tag, p] : failed) {
    wire::Reply none;
    p.done(error, none);
  }
}

void MuxConnection::read_loop(std::shared_ptr<Fd> fd, uint64_t generation) {
  std::string buf;
  size_t pos = 0;
  char chunk[16 * 1024];
  std::string why;
  for (;;) {
    ssize_t n = ::recv(fd->get(), chunk, sizeof chunk, 0);
    if (n == 0) {
      why = "the store at " + where_ + " closed the connection";
      break;
    }
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd p{.fd = fd->get(), .events = POLLIN, .revents = 0};
        ::poll(&p, 1, -1);
        continue;
      }
      why = "receiving from the store at " + where_ +
            " failed: " + std::strerror(errno);
      break;
    }
    last_heard_ = Clock::now().time_since_epoch().count();
    buf.append(chunk, static_cast<size_t>(n));
    try {
      for (;;) {
        std::string_view view(buf.data() + pos, buf.size() - pos);
        if (view.size() < sizeof(uint64_t)) {
          break;
        }
        auto tag = wire::load<uint64_t>(view.data());
        wire::Reply reply;
        Done done;
        {
          std::lock_guard lock(mutex_);
          if (generation != generation_) {
            return;  // replaced: its requests were failed already
          }
          auto it = pending_.find(tag);
          if (it == pending_.end()) {
            throw ProtocolError(
                "a reply names tag " + std::to_string(tag) +
                ", which no request in flight has");
          }
          size_t used = wire::decode_reply(
              view.substr(sizeof(uint64_t)), it->second.req, reply);
          if (used == 0) {
            break;
          }
          pos += sizeof(uint64_t) + used;
          done = std::move(it->second.done);
          pending_.erase(it);
        }
        try {
          done(nullptr, reply);
        } catch (const std::exception& e) {
          TIDE_LOG_ERROR("[store] a reply's handler failed: {}", e.what());
        }
      }
    } catch (const Error& e) {
      why = "the store at " + where_ + " sent a bad reply: " + e.what();
      break;
    }
    if (pos == buf.size()) {
      buf.clear();
      pos = 0;
    } else if (pos > 64 * 1024) {
      buf.erase(0, pos);
      pos = 0;
    }
  }
  fail(generation, why);
}

}  // namespace tide::store::detail
