#include "runtime/auth/handshake.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cctype>
#include <cstring>

namespace troupe::auth {
namespace {

// Offsets shared by the hello and the answer, which start alike.
constexpr size_t magic_at = 0, protocol_at = 8, job_at = 12, nonce_at = 28, mac_at = 60;
constexpr size_t job_bytes = 16;
constexpr std::string_view client_label = "troupe handshake client";
constexpr std::string_view server_label = "troupe handshake server";

static_assert(mac_at == nonce_at + 32 && server_hello_size == mac_at);
static_assert(client_answer_size == mac_at + 32 && server_verdict_size == 1 + 32);

void put_header(unsigned char* out, const handshake_identity& me) {
  std::memcpy(out + magic_at, handshake_magic.data(), handshake_magic.size());
  const auto v = static_cast<uint32_t>(me.protocol);
  for (int i = 0; i < 4; ++i) out[protocol_at + i] = static_cast<unsigned char>(v >> (8 * i));
  std::memset(out + job_at, 0, job_bytes);
  std::memcpy(out + job_at, me.job_id.data(), std::min(me.job_id.size(), job_bytes));
}

bool has_magic(const unsigned char* p) {
  return std::memcmp(p + magic_at, handshake_magic.data(), handshake_magic.size()) == 0;
}

int protocol_of(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{p[protocol_at + i]} << (8 * i);
  return static_cast<int>(v);
}

// What a peer stated as its job id, safe to print: a stranger chooses these bytes.
std::string job_of(const unsigned char* p) {
  std::string s;
  for (size_t i = 0; i < job_bytes && p[job_at + i] != 0; ++i) {
    const unsigned char c = p[job_at + i];
    s.push_back(std::isalnum(c) ? static_cast<char>(c) : '?');
  }
  return s;
}

bool same_job(const handshake_identity& me, const unsigned char* p) {
  unsigned char mine[job_bytes] = {};
  std::memcpy(mine, me.job_id.data(), std::min(me.job_id.size(), job_bytes));
  return std::memcmp(mine, p + job_at, job_bytes) == 0;
}

using mac = std::array<unsigned char, 32>;

// HMAC-SHA256(key, label | a | b), one-shot (HMAC_CTX is deprecated in OpenSSL 3).
mac keyed(const hmac_key& key, std::string_view label, const unsigned char* a, size_t na,
          const unsigned char* b, size_t nb) {
  std::array<unsigned char, 32 + server_hello_size + client_answer_size> msg{};
  const size_t n = label.size() + na + nb;
  if (n > msg.size()) throw credentials_error("handshake: transcript too long");
  std::memcpy(msg.data(), label.data(), label.size());
  std::memcpy(msg.data() + label.size(), a, na);
  std::memcpy(msg.data() + label.size() + na, b, nb);
  mac out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), msg.data(), n, out.data(),
            &len) ||
      len != out.size())
    throw credentials_error("handshake: HMAC-SHA256 failed");
  return out;
}

mac client_mac(const handshake_identity& me, const server_hello& hello,
               const unsigned char* answer) {
  return keyed(me.key, client_label, hello.data(), hello.size(), answer, mac_at);
}

mac server_mac(const handshake_identity& me, const server_hello& hello,
               const client_answer& answer) {
  return keyed(me.key, server_label, hello.data(), hello.size(), answer.data(), answer.size());
}

handshake_outcome fail(handshake_status s, const unsigned char* p, std::string message) {
  handshake_outcome o;
  o.status = s;
  if (p != nullptr) {
    o.peer_job = job_of(p);
    o.peer_protocol = protocol_of(p);
  }
  o.message = std::move(message);
  return o;
}

std::string str(std::string_view s) { return std::string(s); }

}  // namespace

const char* to_string(handshake_status s) {
  switch (s) {
    case handshake_status::ok:
      return "ok";
    case handshake_status::not_troupe:
      return "not_troupe";
    case handshake_status::other_protocol:
      return "other_protocol";
    case handshake_status::other_job:
      return "other_job";
    case handshake_status::bad_proof:
      return "bad_proof";
  }
  return "unknown";
}

handshake_identity make_identity(const job_credentials& c, std::string_view purpose) {
  return handshake_identity{c.job_id, protocol_version, derive_key(c, purpose)};
}

handshake_nonce random_nonce() {
  handshake_nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
    throw credentials_error("handshake: cannot draw a random nonce (OpenSSL RAND)");
  return n;
}

server_hello make_server_hello(const handshake_identity& me, const handshake_nonce& nonce) {
  server_hello h{};
  put_header(h.data(), me);
  std::memcpy(h.data() + nonce_at, nonce.data(), nonce.size());
  return h;
}

handshake_outcome check_client_answer(const handshake_identity& me, const server_hello& hello,
                                      const client_answer& answer, server_verdict& verdict) {
  verdict.fill(0);
  const unsigned char* p = answer.data();
  handshake_outcome o;
  if (!has_magic(p)) {
    o = fail(handshake_status::not_troupe, nullptr, "not a troupe handshake");
  } else if (protocol_of(p) != me.protocol) {
    o = fail(handshake_status::other_protocol, p,
             "a peer of protocol version " + std::to_string(protocol_of(p)) +
                 " (this listener speaks " + std::to_string(me.protocol) + ")");
  } else if (!same_job(me, p)) {
    o = fail(handshake_status::other_job, p,
             "a member of job " + job_of(p) + " (this listener is job " + me.job_id + "'s)");
  } else {
    const mac expected = client_mac(me, hello, p);
    if (CRYPTO_memcmp(expected.data(), p + mac_at, expected.size()) != 0) {
      o = fail(handshake_status::bad_proof, p,
               "a wrong proof: the peer does not hold job " + me.job_id + "'s secret");
    } else {
      const mac proof = server_mac(me, hello, answer);
      std::memcpy(verdict.data() + 1, proof.data(), proof.size());
    }
  }
  verdict[0] = static_cast<unsigned char>(o.status);
  return o;
}

handshake_outcome check_server_hello(const handshake_identity& me, const server_hello& hello,
                                     std::string_view where) {
  const unsigned char* p = hello.data();
  if (!has_magic(p))
    return fail(handshake_status::not_troupe, nullptr,
                str(where) + " is not a troupe listener (it sent no troupe handshake)");
  if (protocol_of(p) != me.protocol)
    return fail(handshake_status::other_protocol, p,
                str(where) + " speaks protocol version " + std::to_string(protocol_of(p)) +
                    ", and this troupe build speaks " + std::to_string(me.protocol) +
                    "; run the same troupe build on every machine of a job");
  if (!same_job(me, p))
    return fail(handshake_status::other_job, p,
                str(where) + " belongs to job " + job_of(p) +
                    ", this process's join token is for job " + me.job_id);
  return {};
}

client_answer make_client_answer(const handshake_identity& me, const server_hello& hello,
                                 const handshake_nonce& nonce) {
  client_answer a{};
  put_header(a.data(), me);
  std::memcpy(a.data() + nonce_at, nonce.data(), nonce.size());
  // No keyed bytes for a listener that is not ours: it could replay them elsewhere.
  if (check_server_hello(me, hello, "").ok()) {
    const mac m = client_mac(me, hello, a.data());
    std::memcpy(a.data() + mac_at, m.data(), m.size());
  }
  return a;
}

handshake_outcome check_server_verdict(const handshake_identity& me, const server_hello& hello,
                                       const client_answer& answer, const server_verdict& verdict,
                                       std::string_view where) {
  switch (static_cast<handshake_status>(verdict[0])) {
    case handshake_status::ok: {
      const mac expected = server_mac(me, hello, answer);
      if (CRYPTO_memcmp(expected.data(), verdict.data() + 1, expected.size()) != 0)
        return fail(handshake_status::bad_proof, hello.data(),
                    str(where) + " could not prove that it holds job " + me.job_id +
                        "'s secret; refusing it (is another program listening there?)");
      return {};
    }
    case handshake_status::other_protocol:
      return fail(handshake_status::other_protocol, hello.data(),
                  str(where) + " refused this process's protocol version " +
                      std::to_string(me.protocol) + " (it speaks " +
                      std::to_string(protocol_of(hello.data())) + ")");
    case handshake_status::other_job:
      return fail(handshake_status::other_job, hello.data(),
                  str(where) + " belongs to job " + job_of(hello.data()) +
                      ", this process's join token is for job " + me.job_id);
    case handshake_status::bad_proof:
      return fail(handshake_status::bad_proof, hello.data(),
                  str(where) + " refused this process's proof: its join token does not hold job " +
                      me.job_id +
                      "'s secret (a stale or damaged copy?); copy the token again from the "
                      "coordinator's run directory");
    case handshake_status::not_troupe:
      break;
  }
  return fail(handshake_status::not_troupe, hello.data(),
              str(where) + " sent a malformed handshake verdict (status " +
                  std::to_string(verdict[0]) + ")");
}

}  // namespace troupe::auth
