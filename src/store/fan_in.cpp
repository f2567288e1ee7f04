#include "store/fan_in.h"

#include <sys/socket.h>

#include <algorithm>

#include "tide/common/error.h"
#include "tide/common/logging.h"

#include "net/address.h"
#include "store/server_impl.h"

namespace tide::store::detail {

namespace {

using wire::Op;

// An upstream WAIT is asked again when its bound passes and a client still
// waits: clients' waits have no bound in the protocol, and this keeps a
// WAIT nobody wants any more from lasting for ever upstream.
constexpr uint64_t kUpstreamWaitMs = 60'000;
// Reconnecting after a loss: one attempt, bounded.
constexpr milliseconds kReconnect{5'000};

// Requests that may be asked again after the connection is lost.
bool idempotent(Op op) {
  switch (op) {
    case Op::kGet:
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
    case Op::kNumKeys:
    case Op::kQueueLen:
      return true;
    default:
      return false;
  }
}

// Reads whose identical twins of one turn are asked once.
bool shared_read(Op op) {
  switch (op) {
    case Op::kGet:
    case Op::kCheck:
    case Op::kMultiGet:
    case Op::kNumKeys:
    case Op::kQueueLen:
      return true;
    default:
      return false;
  }
}

std::vector<std::string> sorted_unique(std::vector<std::string> keys) {
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

}  // namespace

Forwarder::Forwarder(
    asio::io_context& io,
    const StoreUpstream& upstream,
    std::unordered_set<std::shared_ptr<Connection>>& connections)
    : io_(io),
      endpoint_{
          .host = upstream.host,
          .port = upstream.port,
          .token = upstream.token,
          .connect_timeout = upstream.connect_timeout},
      where_(net::format_host_port(upstream.host, upstream.port)),
      connections_(connections),
      socket_(io) {}

void Forwarder::start() {
  connect(Clock::now() + endpoint_.connect_timeout, true);
}

void Forwarder::connect(Clock::time_point deadline, bool retry) {
  Fd fd = connect_tagged(endpoint_, deadline, retry);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  socket_ = asio::ip::tcp::socket(io_);
  socket_.assign(
      addr.ss_family == AF_INET6 ? asio::ip::tcp::v6() : asio::ip::tcp::v4(),
      fd.release());
  up_ = true;
  in_.clear();
  read();
}

void Forwarder::close() {
  closed_ = true;
  up_ = false;
  asio::error_code ec;
  socket_.close(ec);
  pending_.clear();
  waits_.clear();
  window_.clear();
}

void Forwarder::forward(
    const std::shared_ptr<Connection>& conn, wire::Request& req) {
  ++requests_;
  if (wire::has_reply(req.op) && req.op != Op::kWait) {
    conn->hold();
  }
  window_.emplace_back(conn, std::move(req));
  schedule();
}

void Forwarder::schedule() {
  if (flush_posted_) {
    return;
  }
  flush_posted_ = true;
  // Posted: the requests of every connection read in this turn of the
  // loop are in the window by the time it runs.
  asio::post(io_, [this] { flush(); });
}

void Forwarder::cancel_wait(Connection& conn) {
  std::erase_if(window_, [&](const auto& item) {
    return item.second.op == Op::kWait && item.first.lock().get() == &conn;
  });
  for (auto& [keys, tag] : waits_) {
    auto& targets = pending_.at(tag).targets;
    std::erase_if(
        targets, [&](const Target& t) { return t.conn.lock().get() == &conn; });
  }
  conn.send_byte(wire::kWaitCanceled);
}

void Forwarder::flush() {
  flush_posted_ = false;
  if (closed_) {
    return;
  }
  auto items = std::move(window_);
  window_.clear();
  if (!up_) {
    try {
      connect(Clock::now() + kReconnect, false);
    } catch (const Error& e) {
      for (auto& [weak, req] : items) {
        if (auto conn = weak.lock()) {
          conn->close(
              spdlog::level::warn,
              std::string("the job's store is unreachable: ") + e.what());
        }
      }
      return;
    }
  }
  // The writes, in order; a run of SETs as one MULTI_SET.
  wire::Request run{.op = Op::kMultiSet};
  std::vector<std::shared_ptr<Connection>> run_conns;
  auto end_run = [&] {
    if (run.keys.empty()) {
      return;
    }
    if (run.keys.size() == 1) {
      run.op = Op::kSet;
    }
    uint64_t tag = send(std::move(run), {});
    for (auto& c : run_conns) {
      c->last_write_tag = tag;
    }
    run = wire::Request{.op = Op::kMultiSet};
    run_conns.clear();
  };
  for (auto& [weak, req] : items) {
    if (wire::has_reply(req.op)) {
      continue;
    }
    auto conn = weak.lock();
    if (!conn) {
      continue;  // its client is gone before the write left: as if unsent
    }
    if (req.op == Op::kSet) {
      run.keys.push_back(std::move(req.keys[0]));
      run.values.push_back(std::move(req.values[0]));
      run_conns.push_back(conn);
      continue;
    }
    end_run();
    conn->last_write_tag = send(std::move(req), {});
  }
  end_run();
  // Then the requests with a reply: shared reads, summed ADDs, shared
  // WAITs, the rest one by one.
  std::vector<Entry> entries;
  std::map<std::pair<Op, std::vector<std::string>>, size_t> reads;
  std::map<std::string, size_t> adds;
  for (auto& [weak, req] : items) {
    if (!wire::has_reply(req.op) || weak.expired()) {
      continue;
    }
    if (shared_read(req.op)) {
      auto [it, fresh] = reads.try_emplace({req.op, req.keys}, entries.size());
      if (fresh) {
        entries.push_back({std::move(req), {}});
      }
      entries[it->second].targets.push_back({weak});
    } else if (req.op == Op::kAdd) {
      auto [it, fresh] = adds.try_emplace(req.keys[0], entries.size());
      if (fresh) {
        entries.push_back(
            {wire::Request{.op = Op::kAdd, .keys = req.keys}, {}});
      }
      Entry& e = entries[it->second];
      e.req.delta += req.delta;
      e.targets.push_back({weak, e.req.delta});
    } else if (req.op == Op::kWait) {
      auto keys = sorted_unique(std::move(req.keys));
      if (auto it = waits_.find(keys); it != waits_.end()) {
        pending_.at(it->second).targets.push_back({weak});
        continue;
      }
      uint64_t tag = send({.op = Op::kWait, .keys = keys}, {{weak}});
      waits_.emplace(std::move(keys), tag);
    } else {
      entries.push_back({std::move(req), {{weak}}});
    }
  }
  for (auto& e : entries) {
    send(std::move(e.req), std::move(e.targets));
  }
  write();
}

uint64_t Forwarder::send(wire::Request req, std::vector<Target> targets) {
  uint64_t tag = next_tag_++;
  wire::Tagged t{
      .tag = tag, .wait_ms = req.op == Op::kWait ? kUpstreamWaitMs : 0};
  wire::encode_request(req, Dialect::kModern, out_, &t);
  ++frames_;
  if (wire::has_reply(req.op)) {
    pending_.emplace(tag, Entry{std::move(req), std::move(targets)});
  }
  return tag;
}

void Forwarder::write() {
  if (writing_now_ || out_.empty() || !up_) {
    return;
  }
  writing_now_ = true;
  writing_.swap(out_);
  asio::async_write(
      socket_,
      asio::buffer(writing_),
      [this](const asio::error_code& ec, size_t) {
        writing_now_ = false;
        writing_.clear();
        if (ec) {
          if (ec != asio::error::operation_aborted && !closed_) {
            lost("writing to it failed: " + ec.message());
          }
          return;
        }
        write();
      });
}

void Forwarder::read() {
  socket_.async_read_some(
      asio::buffer(chunk_), [this](const asio::error_code& ec, size_t n) {
        if (ec) {
          if (ec != asio::error::operation_aborted && !closed_) {
            lost(
                ec == asio::error::eof ? "it closed the connection"
                                       : ec.message());
          }
          return;
        }
        in_.append(chunk_.data(), n);
        size_t pos = 0;
        try {
          while (in_.size() - pos >= sizeof(uint64_t)) {
            auto tag = wire::load<uint64_t>(in_.data() + pos);
            auto it = pending_.find(tag);
            if (it == pending_.end()) {
              throw ProtocolError(
                  "a reply names tag " + std::to_string(tag) +
                  ", which no request in flight has");
            }
            wire::Reply reply;
            size_t used = wire::decode_reply(
                std::string_view(in_).substr(pos + sizeof(uint64_t)),
                it->second.req,
                reply);
            if (used == 0) {
              break;
            }
            pos += sizeof(uint64_t) + used;
            Entry entry = std::move(it->second);
            pending_.erase(it);
            confirmed_ = std::max(confirmed_, tag);
            on_reply(tag, std::move(entry), reply);
            if (!up_) {
              return;  // lost meanwhile (a reply's client closed it)
            }
          }
        } catch (const Error& e) {
          lost(std::string("it sent a bad reply: ") + e.what());
          return;
        }
        in_.erase(0, pos);
        read();
      });
}

void Forwarder::on_reply(uint64_t tag, Entry entry, wire::Reply& reply) {
  const Op op = entry.req.op;
  if (op == Op::kWait) {
    auto keys = entry.req.keys;
    if (auto it = waits_.find(keys); it != waits_.end() && it->second == tag) {
      waits_.erase(it);
    }
    if (reply.byte == wire::kWaitTimedOut) {
      std::erase_if(
          entry.targets, [](const Target& t) { return t.conn.expired(); });
      if (!entry.targets.empty()) {
        uint64_t again = send(std::move(entry.req), std::move(entry.targets));
        waits_.emplace(std::move(keys), again);
        write();
      }
      return;
    }
  }
  std::string bytes;
  if (op != Op::kAdd) {
    wire::encode_reply(reply, op, bytes);
  }
  for (const Target& t : entry.targets) {
    auto conn = t.conn.lock();
    if (!conn) {
      continue;
    }
    if (op == Op::kAdd) {
      bytes.clear();
      wire::Writer(bytes).i64(reply.number - (entry.req.delta - t.upto));
    }
    conn->send(bytes);
    if (op != Op::kWait) {
      conn->release();
    }
  }
}

void Forwarder::lost(const std::string& why) {
  up_ = false;
  asio::error_code ignored;
  socket_.close(ignored);
  in_.clear();
  out_.clear();
  TIDE_LOG_WARN(
      "[store fan-in] lost the connection to the job's store at {}: {}; "
      "asking again for the {} reads and waits in flight",
      where_,
      why,
      std::count_if(pending_.begin(), pending_.end(), [](const auto& p) {
        return idempotent(p.second.req.op);
      }));
  auto pending = std::move(pending_);
  pending_.clear();
  waits_.clear();
  std::string reason = "the connection to the job's store at " + where_ +
                       " was lost (" + why + ")";
  // Clients whose requests or writes may or may not have been applied.
  std::vector<std::shared_ptr<Connection>> doomed;
  std::vector<Entry> again;
  for (auto& [tag, entry] : pending) {
    if (idempotent(entry.req.op)) {
      again.push_back(std::move(entry));
      continue;
    }
    for (const Target& t : entry.targets) {
      if (auto c = t.conn.lock()) {
        doomed.push_back(c);
      }
    }
  }
  for (const auto& c : connections_) {
    if (c->last_write_tag > confirmed_) {
      doomed.push_back(c);
    }
  }
  for (const auto& c : doomed) {
    c->close(spdlog::level::warn, reason + " with its writes in flight");
  }
  try {
    connect(Clock::now() + kReconnect, false);
  } catch (const Error& e) {
    TIDE_LOG_ERROR("[store fan-in] {}", e.what());
    for (auto& entry : again) {
      for (const Target& t : entry.targets) {
        if (auto c = t.conn.lock()) {
          c->close(spdlog::level::warn, reason + " and is unreachable");
        }
      }
    }
    return;
  }
  for (auto& entry : again) {
    Op op = entry.req.op;
    auto keys = entry.req.keys;
    uint64_t tag = send(std::move(entry.req), std::move(entry.targets));
    if (op == Op::kWait) {
      waits_.emplace(std::move(keys), tag);
    }
  }
  write();
}

}  // namespace tide::store::detail
