#include "cli/command_line.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>

namespace troupe::cli {
namespace {

// The long name CLI11 reports for an option declared as "-o,--output".
std::string long_name(const std::string& names) {
  const auto comma = names.rfind(',');
  return comma == std::string::npos ? names : names.substr(comma + 1);
}

bool looks_like_option(const std::string& arg) {
  if (arg.size() < 2 || arg[0] != '-') return false;
  // "-3" or "-1e-5" is a value (a negative number), not an option.
  return !(std::isdigit(static_cast<unsigned char>(arg[1])) || arg[1] == '.');
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::optional<std::string> closest_match(const std::string& word,
                                         const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  size_t best_distance = 0;
  for (const auto& c : candidates) {
    // A prefix of a real name is the commonest typo of all ("--resum"): always close.
    const size_t d = c.rfind(word, 0) == 0 && word.size() >= 4 ? 1 : edit_distance(word, c);
    if (!best || d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  // Close: at most a third of the word's letters wrong.
  if (!best || best_distance > std::max<size_t>(2, word.size() / 3)) return std::nullopt;
  return best;
}

command_line::command_line(std::string command)
    : command_(std::move(command)), app_(std::make_unique<CLI::App>("", command_)) {
  app_->set_help_flag();  // troupe writes its own help
  app_->allow_extras(true);
  flag("-h,--help");
}

command_line::~command_line() = default;

void command_line::value(const std::string& names) {
  app_->add_option(names)->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  names_.push_back(long_name(names));
}

void command_line::flag(const std::string& names) {
  app_->add_flag(names)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  names_.push_back(long_name(names));
  switches_.push_back(long_name(names));
}

usage_error command_line::error(const std::string& what) const {
  return usage_error(command_ + ": " + what + "; see " + command_ + " --help");
}

int64_t command_line::integer(const std::string& flag, const std::string& text, int64_t lo,
                              int64_t hi) const {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi)
    throw error(flag + " must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                ", got '" + text + "'");
  return v;
}

void command_line::parse(const std::vector<std::string>& args, size_t max_positional,
                         const std::string& positional_what) {
  // CLI11 reads its arguments back to front. "--opt=" is an empty value, said as two
  // arguments: CLI11 would take the next argument for the value of a bare "--opt=".
  std::vector<std::string> reversed;
  for (auto it = args.rbegin(); it != args.rend(); ++it) {
    if (looks_like_option(*it) && it->size() > 1 && it->back() == '=' &&
        it->find('=') == it->size() - 1) {
      reversed.push_back("");
      reversed.push_back(it->substr(0, it->size() - 1));
    } else {
      reversed.push_back(*it);
    }
  }
  try {
    app_->parse(reversed);
  } catch (const CLI::ArgumentMismatch& e) {
    // "--world: 1 required  missing": the value is missing.
    std::string said = e.what();
    throw error("option " + said.substr(0, said.find(':')) + " needs a value");
  } catch (const CLI::ParseError& e) {
    throw error(e.what());
  }
  std::map<const CLI::Option*, size_t> seen;
  for (const CLI::Option* opt : app_->parse_order()) {
    const size_t i = seen[opt]++;
    const auto& results = opt->results();
    std::string name = opt->get_lnames().empty() ? opt->get_name() : "--" + opt->get_lnames()[0];
    if (name == "--help") {
      help_ = true;
      continue;
    }
    std::string v = i < results.size() ? results[i] : std::string();
    const bool is_switch = std::find(switches_.begin(), switches_.end(), name) != switches_.end();
    if (is_switch) {
      if (v.empty() || v == "true" || v == "1" || v == "yes") {
        v = "true";
      } else if (v == "false" || v == "0" || v == "no") {
        continue;
      } else {
        throw error(name + " is a switch: give it alone, or as " + name + "=true or =false; got '" +
                    v + "'");
      }
    } else if (looks_like_option(v) &&
               std::find(names_.begin(), names_.end(), v.substr(0, v.find('='))) != names_.end()) {
      // "--world --resume": the next option was taken for the value.
      throw error("option " + name + " needs a value (it was followed by the option " + v + ")");
    }
    given_.push_back({name, v});
  }
  for (const auto& extra : app_->remaining()) {
    if (looks_like_option(extra)) {
      const std::string flag_part = extra.substr(0, extra.find('='));
      const auto near = closest_match(flag_part, names_);
      throw error("unknown option '" + flag_part + "'" +
                  (near ? " (did you mean " + *near + "?)" : std::string()));
    }
    positional_.push_back(extra);
  }
  if (help_) return;
  if (positional_.size() > max_positional)
    throw error(max_positional == 0 ? "unexpected argument '" + positional_.front() + "'"
                                    : "too many " + positional_what + ": '" +
                                          positional_[max_positional] + "' is one too many");
}

std::optional<std::string> command_line::last(const std::string& flag) const {
  for (auto it = given_.rbegin(); it != given_.rend(); ++it)
    if (it->flag == flag) return it->value;
  return std::nullopt;
}

}  // namespace troupe::cli
