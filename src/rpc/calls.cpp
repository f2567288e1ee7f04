#include "rpc/calls.h"

#include "tide/common/error.h"

#include "rpc/messages.h"
#include "transport/fields.h"

namespace tide::rpc::detail {

using CallEnd = rpc_core::CallEnd<transport::Message>;
using transport::FieldReader;
using transport::FieldWriter;

namespace {

// ERROR's fields: the exception's type and message.
std::pair<std::string, std::string> read_error(const std::string& metadata) {
  FieldReader r(metadata, "an error");
  std::string type = r.str();
  std::string message = r.str();
  r.end();
  return {std::move(type), std::move(message)};
}

}  // namespace

Future<Payload> Calls::start(
    int to,
    const std::string& fn,
    std::chrono::milliseconds timeout,
    Payload args,
    std::string label) {
  Promise<Payload> promise;
  Future<Payload> future = promise.get_future();
  transport::Message request{
      MessageType::kRequest,
      table_.new_id(),
      FieldWriter().str(fn).i64(static_cast<int64_t>(timeout.count())).take(),
      {}};
  request.buffers.reserve(1 + args.buffers.size());
  request.buffers.push_back(std::move(args.data));
  for (auto& b : args.buffers) {
    request.buffers.push_back(std::move(b));
  }
  auto done =
      [this, to, fn = label.empty() ? fn : std::move(label), timeout, promise](
          CallEnd end) mutable {
        auto where = [&] { return fn + "() on " + transport_.peer_label(to); };
        switch (end.how) {
          case CallEnd::How::kReplied:
            if (end.reply.type == MessageType::kError) {
              auto [type, message] = read_error(end.reply.metadata);
              promise.set_exception(std::make_exception_ptr(
                  RemoteError(where() + " raised " + type + ": " + message)));
            } else {
              Payload p;
              p.data = std::move(end.reply.buffers[0]);
              p.buffers.assign(
                  std::make_move_iterator(end.reply.buffers.begin() + 1),
                  std::make_move_iterator(end.reply.buffers.end()));
              promise.set_value(std::move(p));
            }
            return;
          case CallEnd::How::kTimedOut:
            promise.set_exception(std::make_exception_ptr(TimeoutError(
                where() + " timed out after " +
                std::to_string(timeout.count()) + " ms")));
            return;
          case CallEnd::How::kNotSent:
            if (end.error) {
              promise.set_exception(end.error);
              return;
            }
            [[fallthrough]];
          case CallEnd::How::kBadReply:
          case CallEnd::How::kLost:
            promise.set_exception(std::make_exception_ptr(
                NetworkError(where() + " failed: " + end.reason)));
            return;
          case CallEnd::How::kStopped:
            promise.set_exception(
                std::make_exception_ptr(NetworkError(end.reason)));
            return;
        }
      };
  table_.start(to, std::move(request), timeout, std::move(done));
  return future;
}

void Calls::on_reply(const transport::Pipe& pipe, transport::Message m) {
  switch (m.type) {
    case MessageType::kResponse:
      if (m.buffers.empty()) {
        throw ProtocolError("RESPONSE frame without its payload buffer");
      }
      break;
    case MessageType::kError:
      read_error(m.metadata);  // throws ProtocolError when malformed
      break;
    default:
      throw ProtocolError(
          std::string("unexpected ") + rpc_message_types().name(m.type) +
          " from a callee");
  }
  uint64_t id = m.id;
  table_.on_reply(pipe, id, std::move(m));
}

}  // namespace tide::rpc::detail
