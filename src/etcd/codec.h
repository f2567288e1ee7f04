// The JSON of etcd's v3 gateway: reading its replies, building its requests
// and classifying its error answers. Pure: no I/O. base64_encode,
// base64_decode and prefix_range_end, defined in codec.cpp, are declared in
// etcd/etcd_client.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "etcd/etcd_client.h"

namespace tide::etcd {

using nlohmann::json;

// Bytes for a message: printable ASCII as is, the rest as \xNN, cut at
// `max` characters.
std::string printable(std::string_view bytes, size_t max = 128);

// "put of key \"a/b\"": how messages name a call.
std::string describe(std::string_view call, std::string_view key);

// gRPC status code names, for etcd's {"code": N}.
std::string grpc_code_name(int64_t code);

// --- reading etcd's JSON -------------------------------------------------
// The gateway leaves out every field at its default value and sends int64s
// as strings, so an absent field is 0, "" or false; a present field of the
// wrong type is a ProtocolError. `context` names the call for messages.

[[noreturn]] void bad_reply(
    const std::string& context, const std::string& what);

// The field, or nullptr when it is absent or null (or object is no object).
const json* find_field(const json& object, const char* name);

const json& object_field(
    const json& object, const char* name, const std::string& context);
const json& array_field(
    const json& object, const char* name, const std::string& context);
int64_t int_field(
    const json& object, const char* name, const std::string& context);
bool bool_field(
    const json& object, const char* name, const std::string& context);
std::string text_field(
    const json& object, const char* name, const std::string& context);
// A base64 field, decoded.
std::string bytes_field(
    const json& object, const char* name, const std::string& context);

KeyValue parse_kv(const json& j, const std::string& context);
int64_t header_revision(const json& reply, const std::string& context);
RangeResult parse_range(const json& reply, const std::string& context);
// A transaction built by txn_put_else_range; failure_op names the response
// of its read ("response_range").
TxnResult parse_txn(
    const json& reply, const char* failure_op, const std::string& context);

// --- building requests ---------------------------------------------------

json range_request(std::string_view key, const RangeOptions& options);
json put_request(std::string_view key, std::string_view value, int64_t lease);
// {kind: request}, one operation of a transaction.
json op(const char* kind, json request);
// A transaction: when `compare` holds, put; else read the key back.
json txn_put_else_range(
    json compare, std::string_view key, std::string_view value, int64_t lease);

// --- error answers -------------------------------------------------------

// What etcd's error body says, for messages: "etcdserver: request is too
// large (gRPC InvalidArgument)".
std::string etcd_error_text(const json& body);

// The gRPC code of an error answer, or -1.
int64_t error_code(const json& reply);

// Throws the error an answer of HTTP `status` (not 200, not 5xx) stands for:
// InvalidArgument when the request was at fault, else RemoteError.
[[noreturn]] void throw_error_reply(
    const std::string& context, long status, const json& reply);

}  // namespace tide::etcd
