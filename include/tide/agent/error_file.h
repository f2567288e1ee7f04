#pragma once

#include <string>

// torch's error file (TORCHELASTIC_ERROR_FILE), as its @record decorator
// writes it:
//   {"message": {"message": "ValueError: bad", "extraInfo":
//     {"py_callstack": "Traceback ...", "timestamp": "1700000000"}}}
// or the newer flat form {"message": "...", "timestamp": 1700000000}.
// The agent reads its workers' files and writes those of C++ function
// workers; the launcher writes tiderun's own.
namespace tide::agent {

struct ErrorFileContents {
  std::string message;
  std::string traceback;
  double timestamp = 0;  // 0 when absent
};

// Parses an error file's text. Never throws: unparsable data yields a
// message that says so.
ErrorFileContents parse_error_file(const std::string& data);

// Writes an error file in torch's format (for C++ function workers).
// Best effort; returns false on I/O failure.
bool write_error_file(
    const std::string& path,
    const std::string& message,
    const std::string& traceback);

// The error JSON with message.errorCode set, as torchrun writes to its own
// TORCHELASTIC_ERROR_FILE for the root-cause worker.
std::string with_error_code(const std::string& data, int exitcode);

// Whole file, or "" when it cannot be read.
std::string read_file(const std::string& path);

}  // namespace tide::agent
