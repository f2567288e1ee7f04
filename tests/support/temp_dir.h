#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace tide::test {

// A file's whole contents ("" when it cannot be read).
inline std::string read_whole(const std::filesystem::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), {}};
}

// A new directory under $TMPDIR, removed with everything in it when this
// goes out of scope.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "tide_test_") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error(
          "mkdtemp failed: " + std::string(std::strerror(errno)));
    }
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const {
    return path_;
  }
  // A new subdirectory.
  std::filesystem::path make(const std::string& name) const {
    std::filesystem::path p = path_ / name;
    std::filesystem::create_directories(p);
    return p;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace tide::test
