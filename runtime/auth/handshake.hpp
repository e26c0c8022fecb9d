#pragma once
// The challenge/response that a listener holding a job's secret runs with each new connection
// before any other byte reaches its decoder: mutual HMAC-SHA256 proofs over a key derived from
// the secret. Pure functions over fixed-size messages; the caller moves the bytes.
//
//   server -> client  hello   (60 B): magic, protocol version, job id, server nonce
//   client -> server  answer  (92 B): magic, protocol version, job id, client nonce,
//                                     HMAC(key, "client" | hello | answer without its MAC)
//   server -> client  verdict (33 B): status, HMAC(key, "server" | hello | answer) when ok
//
// Every message has one fixed size, so a stranger cannot make a listener allocate anything.
// A client that sees another job or protocol in the hello still answers (with a zero MAC), so
// that the listener can count and log why it refused; then both sides close.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/auth/credentials.hpp"

namespace troupe::auth {

using hmac_key = std::array<unsigned char, 32>;
using handshake_nonce = std::array<unsigned char, 32>;

inline constexpr size_t server_hello_size = 60;
inline constexpr size_t client_answer_size = 92;
inline constexpr size_t server_verdict_size = 33;
using server_hello = std::array<unsigned char, server_hello_size>;
using client_answer = std::array<unsigned char, client_answer_size>;
using server_verdict = std::array<unsigned char, server_verdict_size>;

/// The first bytes of every hello: lets a client that expected no handshake say why it failed.
inline constexpr std::string_view handshake_magic{"troupeH1", 8};

/// Who one end claims to be and the key it proves that with.
struct handshake_identity {
  std::string job_id;  ///< at most 16 characters (a job id is 16 hex digits)
  int protocol = protocol_version;
  hmac_key key{};
};

/// The identity of this job's members for one listener: key = derive_key(c, purpose).
handshake_identity make_identity(const job_credentials& c, std::string_view purpose);

/// Why a handshake failed, as seen by the side that checked.
enum class handshake_status : uint8_t {
  ok = 0,
  not_troupe,      ///< the peer's bytes do not start with the magic (not a troupe peer)
  other_protocol,  ///< the peer speaks another protocol version
  other_job,       ///< the peer belongs to another job
  bad_proof,       ///< same job id, but the MAC is wrong: the peer does not hold the secret
};

const char* to_string(handshake_status s);

/// A check's result: on failure, what the peer claimed (for the message) and a sentence.
struct handshake_outcome {
  handshake_status status = handshake_status::ok;
  std::string peer_job;   ///< the job id the peer stated, made printable
  int peer_protocol = 0;  ///< the protocol version the peer stated
  std::string message;    ///< empty when ok

  bool ok() const { return status == handshake_status::ok; }
};

/// A fresh random nonce (OpenSSL RAND_bytes); throws credentials_error if none can be drawn.
handshake_nonce random_nonce();

// ---- server side ----

server_hello make_server_hello(const handshake_identity& me, const handshake_nonce& nonce);

/// Checks a client's answer to `hello` (in this order: magic, protocol, job, MAC with
/// CRYPTO_memcmp). `verdict` is filled in either way and should be sent before closing.
handshake_outcome check_client_answer(const handshake_identity& me, const server_hello& hello,
                                      const client_answer& answer, server_verdict& verdict);

// ---- client side ----

/// Reads a hello: whether this server speaks our protocol and belongs to our job. `where`
/// (host:port and what it is, e.g. "store at 10.0.0.1:4000") starts the message.
handshake_outcome check_server_hello(const handshake_identity& me, const server_hello& hello,
                                     std::string_view where);

/// The answer to `hello`. When the hello names another job or protocol, the MAC is zero
/// (nothing keyed is revealed to a server that is not ours).
client_answer make_client_answer(const handshake_identity& me, const server_hello& hello,
                                 const handshake_nonce& nonce);

/// Checks the server's verdict: its refusal (and why) or its proof that it holds the key.
handshake_outcome check_server_verdict(const handshake_identity& me, const server_hello& hello,
                                       const client_answer& answer, const server_verdict& verdict,
                                       std::string_view where);

}  // namespace troupe::auth
