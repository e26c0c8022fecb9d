#include "runtime/data/token_sidecar.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

namespace troupe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uintmax_t max_sidecar_bytes = 64 * 1024;
constexpr int64_t uint16_ids = int64_t{1} << 16;
constexpr int64_t uint32_ids = int64_t{1} << 32;

std::string errno_text(int e) { return std::strerror(e); }

const json& required(const json& j, const char* key, const std::string& path) {
  const auto it = j.find(key);
  if (it == j.end())
    throw token_sidecar_error(path, std::string("the key \"") + key + "\" is missing");
  return *it;
}

int64_t required_integer(const json& j, const char* key, const std::string& path) {
  const json& v = required(j, key, path);
  // 5.0 or "5" is not an integer; nor is a number beyond int64 (nlohmann reads it as a float).
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX))
    throw token_sidecar_error(path,
                              std::string("\"") + key + "\" must be an integer, got " + v.dump());
  return v.get<int64_t>();
}

std::string required_string(const json& j, const char* key, const std::string& path) {
  const json& v = required(j, key, path);
  if (!v.is_string())
    throw token_sidecar_error(path,
                              std::string("\"") + key + "\" must be a string, got " + v.dump());
  return v.get<std::string>();
}

}  // namespace

token_sidecar_error::token_sidecar_error(std::string path, const std::string& what)
    : data_error("token sidecar " + path + ": " + what), path_(std::move(path)) {}

std::string_view token_dtype_name(token_dtype t) {
  return t == token_dtype::uint16 ? "uint16" : "uint32";
}

int token_width(token_dtype t) { return t == token_dtype::uint16 ? 2 : 4; }

token_dtype token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size <= uint16_ids ? token_dtype::uint16 : token_dtype::uint32;
}

std::string token_sidecar_path(const std::string& token_file) { return token_file + ".json"; }

std::string format_token_sidecar(const token_sidecar& s) {
  // ordered_json: the keys in the documented order, so the file reads as the README shows it.
  nlohmann::ordered_json j;
  j["format"] = std::string(token_sidecar::format_name);
  j["version"] = token_sidecar::format_version;
  j["dtype"] = std::string(token_dtype_name(s.dtype));
  j["vocab_size"] = s.vocab_size;
  j["tokens"] = s.tokens;
  j["tokenizer"] = s.tokenizer;
  return j.dump() + "\n";
}

token_sidecar parse_token_sidecar(std::string_view text, const std::string& path) {
  const json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded())
    throw token_sidecar_error(path, "not valid JSON; write it again with troupe tokenize");
  if (!j.is_object())
    throw token_sidecar_error(path, "must be a JSON object, got " + std::string(j.type_name()));
  static const std::set<std::string> known = {"format",     "version", "dtype",
                                              "vocab_size", "tokens",  "tokenizer"};
  for (const auto& [key, value] : j.items())
    if (!known.contains(key))
      throw token_sidecar_error(path, "unknown key \"" + key +
                                          "\" (version 1 has format, version, dtype, "
                                          "vocab_size, tokens and tokenizer)");
  const std::string format = required_string(j, "format", path);
  if (format != token_sidecar::format_name)
    throw token_sidecar_error(path, "\"format\" must be \"troupe.tokens\", got \"" + format +
                                        "\": not a troupe token sidecar");
  const int64_t version = required_integer(j, "version", path);
  if (version != token_sidecar::format_version)
    throw token_sidecar_error(path, "version " + std::to_string(version) +
                                        " is not one this troupe reads (it reads version 1); "
                                        "use a newer troupe or tokenize again");
  token_sidecar s;
  const std::string dtype = required_string(j, "dtype", path);
  if (dtype == "uint16")
    s.dtype = token_dtype::uint16;
  else if (dtype == "uint32")
    s.dtype = token_dtype::uint32;
  else
    throw token_sidecar_error(path,
                              "\"dtype\" must be \"uint16\" or \"uint32\", got \"" + dtype + "\"");
  s.vocab_size = required_integer(j, "vocab_size", path);
  const int64_t most = s.dtype == token_dtype::uint16 ? uint16_ids : uint32_ids;
  if (s.vocab_size <= 0 || s.vocab_size > most)
    throw token_sidecar_error(path, "\"vocab_size\" must lie in [1, " + std::to_string(most) +
                                        "] for " + dtype + " ids, got " +
                                        std::to_string(s.vocab_size));
  s.tokens = required_integer(j, "tokens", path);
  if (s.tokens < 0)
    throw token_sidecar_error(
        path, "\"tokens\" must be a non-negative integer, got " + std::to_string(s.tokens));
  s.tokenizer = required_string(j, "tokenizer", path);
  return s;
}

token_sidecar read_token_sidecar(const std::string& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    throw token_sidecar_error(path, "cannot be found (" +
                                        (ec ? ec.message() : std::string("no such file")) +
                                        "); a token file needs its sidecar beside it, as "
                                        "troupe tokenize writes it");
  if (!fs::is_regular_file(st)) throw token_sidecar_error(path, "is not a regular file");
  const auto size = fs::file_size(path, ec);
  if (ec) throw token_sidecar_error(path, "cannot read its size: " + ec.message());
  if (size > max_sidecar_bytes)
    throw token_sidecar_error(path, "is " + std::to_string(size) + " bytes, more than a " +
                                        "sidecar's 64 KiB: not a token sidecar");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw token_sidecar_error(path, "cannot be opened: " + errno_text(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw token_sidecar_error(path, "cannot be read: " + errno_text(errno));
  return parse_token_sidecar(text, path);
}

void write_token_sidecar(const std::string& path, const token_sidecar& s) {
  const std::string text = format_token_sidecar(s);
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw token_sidecar_error(path, "cannot be written: " + errno_text(errno));
  size_t done = 0;
  int err = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(temp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(temp.c_str());
    throw token_sidecar_error(path, "cannot be written: " + errno_text(err));
  }
}

}  // namespace troupe
