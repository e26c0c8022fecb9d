#pragma once
// A subcommand's command line, tokenised by CLI11: every subcommand declares its options here
// and reads back what was given, so `--opt value` and `--opt=value` work everywhere, and a
// mistake reads the same in every command: the option, the closest known one, and
// `troupe CMD --help` (a usage_error: exit 2).

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/config.hpp"

namespace CLI {
class App;
}

namespace troupe::cli {

using troupe::usage_error;  // runtime/config.hpp: the environment's mistakes are exit 2 too

class command_line {
 public:
  /// `command` as the user typed it, for messages: "troupe run", "troupe ckpt gc".
  explicit command_line(std::string command);
  ~command_line();
  command_line(const command_line&) = delete;
  command_line& operator=(const command_line&) = delete;

  /// An option that takes one value, each time it is given ("--output" or "-o,--output").
  void value(const std::string& names);
  /// A switch; `--flag=false` (or 0, no) is read as not given.
  void flag(const std::string& names);

  /// Parses `args`. At most `max_positional` arguments that are not options are kept
  /// (`positional_what` names them in the message for one too many).
  void parse(const std::vector<std::string>& args, size_t max_positional = 0,
             const std::string& positional_what = "arguments");

  struct given_option {
    std::string flag;  ///< its long name ("--output"), whichever spelling was used
    std::string value;
  };
  /// Every option given, in command-line order (switches with value "true").
  const std::vector<given_option>& given() const { return given_; }
  /// The last value given for `flag`, if it was given.
  std::optional<std::string> last(const std::string& flag) const;
  bool has(const std::string& flag) const { return last(flag).has_value(); }
  const std::vector<std::string>& positional() const { return positional_; }
  /// -h or --help was given (nothing is checked then).
  bool help() const { return help_; }

  const std::string& command() const { return command_; }
  /// A usage_error for this command: "troupe CMD: WHAT; see troupe CMD --help".
  usage_error error(const std::string& what) const;
  /// `text`, the value of `flag`, as an integer in lo..hi; else an error() saying so.
  int64_t integer(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) const;

 private:
  std::string command_;
  std::unique_ptr<CLI::App> app_;
  std::vector<std::string> names_;  ///< every declared long name, for "did you mean"
  std::vector<std::string> switches_;
  std::vector<given_option> given_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

/// The candidate closest to `word` by edit distance, when it is close enough to be a typo.
std::optional<std::string> closest_match(const std::string& word,
                                         const std::vector<std::string>& candidates);

}  // namespace troupe::cli
