#include "tide/agent/error_file.h"

#include <chrono>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace tide::agent {

using nlohmann::json;

namespace {

double as_seconds(const json& v) {
  if (v.is_number()) {
    return v.get<double>();
  }
  if (v.is_string()) {
    try {
      return std::stod(v.get<std::string>());
    } catch (const std::exception&) {
    }
  }
  return 0;
}

}  // namespace

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return "";
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

ErrorFileContents parse_error_file(const std::string& data) {
  ErrorFileContents out;
  json doc = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    out.message = "error file is not a JSON object: " + data.substr(0, 200);
    return out;
  }
  const json& msg = doc.contains("message") ? doc["message"] : json();
  if (msg.is_string()) {
    out.message = msg.get<std::string>();
    if (doc.contains("timestamp")) {
      out.timestamp = as_seconds(doc["timestamp"]);
    }
  } else if (msg.is_object()) {
    if (msg.contains("message") && msg["message"].is_string()) {
      out.message = msg["message"].get<std::string>();
    }
    if (msg.contains("extraInfo") && msg["extraInfo"].is_object()) {
      const json& extra = msg["extraInfo"];
      if (extra.contains("py_callstack") && extra["py_callstack"].is_string()) {
        out.traceback = extra["py_callstack"].get<std::string>();
      }
      if (extra.contains("timestamp")) {
        out.timestamp = as_seconds(extra["timestamp"]);
      }
    }
  } else {
    out.message = "error file has no \"message\": " + data.substr(0, 200);
  }
  return out;
}

bool write_error_file(
    const std::string& path,
    const std::string& message,
    const std::string& traceback) {
  auto now = std::chrono::system_clock::now().time_since_epoch();
  json doc = {
      {"message",
       {{"message", message},
        {"extraInfo",
         {{"py_callstack", traceback},
          {"timestamp",
           std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now)
                              .count())}}}}}};
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << doc.dump();
  return static_cast<bool>(out);
}

std::string with_error_code(const std::string& data, int exitcode) {
  json doc = json::parse(data, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return data;
  }
  if (doc.contains("message") && doc["message"].is_object()) {
    doc["message"]["errorCode"] = exitcode;
  } else {
    doc["errorCode"] = exitcode;
  }
  return doc.dump();
}

}  // namespace tide::agent
