#pragma once

// The command line of tide's programs: CLI11, with argparse's manners.
#include <cstdio>
#include <optional>

#include <CLI/CLI.hpp>

namespace tide::apps {

// Parses argv into `app`. --help prints the help and --version the version
// (CLI::App::set_version_flag), for exit status 0; a bad command line
// prints the usage and then "NAME: error: WHAT" on stderr, for exit status
// 2 (argparse's). nullopt: the program goes on.
inline std::optional<int> parse_command_line(
    CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::printf("%s\n", e.what());
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(
        stderr,
        "%s\n%s: error: %s\n",
        app.help().c_str(),
        app.get_name().c_str(),
        e.what());
    return 2;
  }
  return std::nullopt;
}

}  // namespace tide::apps
