#include "rpc/calls.h"

#include <vector>

#include "tide/common/error.h"
#include "tide/common/logging.h"

#include "rpc/messages.h"
#include "transport/fields.h"

namespace tide::rpc::detail {

using transport::FieldReader;
using transport::FieldWriter;

Calls::Calls(transport::Transport& transport, std::string self_name)
    : transport_(transport), self_name_(std::move(self_name)) {}

Future<Payload> Calls::start(
    int to,
    std::string fn,
    std::chrono::milliseconds timeout,
    Payload args,
    transport::MessageType type,
    std::string_view extra) {
  Promise<Payload> promise;
  Future<Payload> future = promise.get_future();
  count_.fetch_add(1);
  uint64_t id = next_id_.fetch_add(1);
  Pending call{std::move(promise), nullptr, to, std::move(fn), timeout, {}};
  transport::Pipe pipe;
  try {
    pipe = transport_.pipe_to(to);
  } catch (...) {
    fail(call, std::current_exception());
    return future;
  }
  call.pipe = pipe.id();
  transport::Message request{
      type,
      id,
      FieldWriter()
          .str(call.fn)
          .i64(static_cast<int64_t>(timeout.count()))
          .take(),
      {}};
  request.metadata.append(extra);
  request.buffers.reserve(1 + args.buffers.size());
  request.buffers.push_back(std::move(args.data));
  for (auto& b : args.buffers) {
    request.buffers.push_back(std::move(b));
  }
  {
    std::lock_guard lock(mutex_);
    // A timeout past any useful horizon (milliseconds::max()) never fires.
    auto at = timeout < std::chrono::hours(24 * 365 * 100)
                  ? Clock::now() + timeout
                  : Clock::time_point::max();
    call.deadline = deadlines_.emplace(at, id);
    pending_.emplace(id, std::move(call));
    // Calls mostly share a timeout: a later deadline needs no new alarm.
    if (at < alarm_at_) {
      alarm_at_ = at;
      transport_.post([this] { expire(); });
    }
  }
  // On the books first: a connection lost after this reports the call
  // (on_closed); one lost before it says so here.
  std::string why_not;
  try {
    if (pipe.send(std::move(request), &why_not)) {
      return future;
    }
  } catch (...) {
    if (auto p = take(id)) {
      fail(*p, std::current_exception());
    }
    return future;
  }
  if (auto p = take(id)) {
    fail(
        *p,
        std::make_exception_ptr(NetworkError(
            p->fn + "() on " + transport_.peer_label(to) +
            " failed: " + why_not)));
  }
  return future;
}

void Calls::on_reply(const transport::Pipe& pipe, transport::Message m) {
  switch (m.type) {
    case MessageType::kResponse: {
      if (m.buffers.empty()) {
        throw ProtocolError("RESPONSE frame without its payload buffer");
      }
      Payload p;
      p.data = std::move(m.buffers[0]);
      p.buffers.assign(
          std::make_move_iterator(m.buffers.begin() + 1),
          std::make_move_iterator(m.buffers.end()));
      if (auto call = take(m.id)) {
        complete(*call, std::move(p), nullptr);
      }
      return;
    }
    case MessageType::kError: {
      FieldReader r(m.metadata, "an error");
      std::string type = r.str();
      std::string message = r.str();
      r.end();
      if (auto call = take(m.id)) {
        fail(
            *call,
            std::make_exception_ptr(RemoteError(
                call->fn + "() on " + transport_.peer_label(pipe.peer()) +
                " raised " + type + ": " + message)));
      }
      return;
    }
    default:
      throw ProtocolError(
          std::string("unexpected ") + rpc_message_types().name(m.type) +
          " from a callee");
  }
}

void Calls::on_closed(const transport::Pipe& pipe, const std::string& reason) {
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [id, call] : pending_) {
      if (call.pipe == pipe.id()) {
        ids.push_back(id);
      }
    }
  }
  for (uint64_t id : ids) {
    if (auto p = take(id)) {
      fail(
          *p,
          std::make_exception_ptr(NetworkError(
              p->fn + "() on " + transport_.peer_label(p->peer) +
              " failed: " + reason)));
    }
  }
}

void Calls::fail_all(const std::string& why) {
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [id, call] : pending_) {
      ids.push_back(id);
    }
  }
  for (uint64_t id : ids) {
    if (auto p = take(id)) {
      fail(*p, std::make_exception_ptr(NetworkError(why)));
    }
  }
}

void Calls::expire() {
  std::vector<uint64_t> late;
  Clock::time_point next;
  {
    std::lock_guard lock(mutex_);
    auto now = Clock::now();
    for (auto it = deadlines_.begin();
         it != deadlines_.end() && it->first <= now;
         ++it) {
      late.push_back(it->second);
    }
    next = deadlines_.size() > late.size()
               ? std::next(deadlines_.begin(), static_cast<long>(late.size()))
                     ->first
               : Clock::time_point::max();
    alarm_at_ = next;
  }
  for (uint64_t id : late) {
    if (auto p = take(id)) {
      // Its request may still wait behind others (a peer that does not
      // read): it is not sent late, nor kept.
      transport_.cancel(p->peer, id);
      fail(
          *p,
          std::make_exception_ptr(TimeoutError(
              p->fn + "() on " + transport_.peer_label(p->peer) +
              " timed out after " + std::to_string(p->timeout.count()) +
              " ms")));
    }
  }
  transport_.set_alarm(next, [this] { expire(); });
}

std::optional<Calls::Pending> Calls::take(uint64_t id) {
  std::lock_guard lock(mutex_);
  auto it = pending_.find(id);
  if (it == pending_.end()) {
    return std::nullopt;
  }
  Pending p = std::move(it->second);
  pending_.erase(it);
  deadlines_.erase(p.deadline);
  return p;
}

void Calls::complete(
    Pending& call, std::optional<Payload> value, std::exception_ptr error) {
  count_.fetch_sub(1);
  // Continuations run here, on whatever thread completes the call: one that
  // throws must not take the I/O thread (or a reader) down with it.
  try {
    if (error) {
      call.promise.set_exception(std::move(error));
    } else {
      call.promise.set_value(std::move(*value));
    }
  } catch (const std::exception& e) {
    TIDE_LOG_ERROR(
        "[{}] a continuation of {}() threw: {}", self_name_, call.fn, e.what());
  } catch (...) {
    TIDE_LOG_ERROR("[{}] a continuation of {}() threw", self_name_, call.fn);
  }
}

}  // namespace tide::rpc::detail
