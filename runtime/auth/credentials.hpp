#pragma once
// A job's credentials: who may talk to its listeners. `troupe run` (or `troupe coordinator`)
// makes them once per job; every agent and worker loads them from the join-token file, whose
// path (never its content) is passed on the command line.
//
// The join token is one text file, mode 0600:
//   troupe-join-token 1
//   job <job id, 16 hex digits>
//   protocol <control-plane protocol version>
//   secret <64 hex digits>
//   -----BEGIN CERTIFICATE----- ... (the job's self-signed certificate)
//   -----BEGIN PRIVATE KEY----- ... (its key)
// The secret authenticates the store and the replica store (HMAC challenge and response); the
// certificate and key authenticate the control plane (CAF's middleman over mutual TLS, which
// trusts only this certificate). OpenSSL's PEM readers skip the text lines, so the same file is
// given to CAF as certificate, key and trusted authority.

#include <array>
#include <stdexcept>
#include <string>
#include <string_view>

namespace troupe::auth {

/// The control-plane protocol version (the shape of troupe's messages) a token is made for; a
/// process of another build refuses a token, and a coordinator, of another version by name.
/// Bumped whenever a message in actors/wire/messages.hpp changes shape.
inline constexpr int protocol_version = 19;

/// Thrown when a token cannot be made or read; the message names the file and what is wrong.
class credentials_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct job_credentials {
  std::string job_id;      ///< 16 hex digits; not secret (it names the job in refusals)
  int protocol = 0;        ///< protocol_version of the build that made the token
  std::string secret;      ///< 32 random bytes
  std::string token_path;  ///< absolute path of the join-token file

  bool valid() const { return !job_id.empty() && secret.size() == 32; }
};

/// Makes fresh credentials (random job id, secret, an EC P-256 key and a self-signed
/// certificate) and writes them to `path` with mode 0600, replacing any file there.
job_credentials create_join_token(const std::string& path);

/// Reads a join token. Refuses a file that others can read or write, a malformed one, and
/// one made for another protocol version, each with a message that says which.
job_credentials load_join_token(const std::string& path);

/// Reads a file that holds a secret: refused (naming the fix) unless it is a regular file of
/// at most `max_bytes` that no other user can read or write. `what` names it in messages.
std::string read_private_file(const std::string& path, const std::string& what, size_t max_bytes);

/// The bearer token the metrics endpoint asks for (--metrics-token FILE): the file's first
/// line, trimmed; printable ASCII, at most 4 KiB; the file mode 0600 or stricter.
std::string read_bearer_token(const std::string& path);

/// A 32-byte key for one purpose ("replica", ...), derived from the job's secret
/// (HMAC-SHA256 of the purpose): every member computes the same key without asking anyone for
/// it, and knowing one purpose's key tells nothing about the secret or another purpose's.
std::array<unsigned char, 32> derive_key(const job_credentials& c, std::string_view purpose);

/// This process's credentials, set once at start (by `troupe run`, or from --join-token);
/// listeners and clients that are not given credentials explicitly use these. Empty (not
/// valid()) until set.
const job_credentials& process_credentials();
void set_process_credentials(job_credentials c);

}  // namespace troupe::auth
