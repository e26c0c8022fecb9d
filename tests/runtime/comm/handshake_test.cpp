// The listeners' handshake as pure functions (runtime/auth/handshake.hpp): no sockets.
#include "runtime/auth/handshake.hpp"

#include <gtest/gtest.h>

#include <string>

using namespace troupe::auth;

namespace {

hmac_key key_of(unsigned char seed) {
  hmac_key k{};
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<unsigned char>(seed + i);
  return k;
}

const handshake_identity server_id{"00112233aabbccdd", protocol_version, key_of(1)};
constexpr std::string_view where = "the key-value store at 10.0.0.1:4000";

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

struct run_result {
  handshake_outcome client_saw_hello;
  handshake_outcome server_saw_answer;
  handshake_outcome client_saw_verdict;
};

/// One handshake between `server` and `client`, as the bytes would travel.
run_result run(const handshake_identity& server, const handshake_identity& client) {
  run_result r;
  const server_hello hello = make_server_hello(server, random_nonce());
  r.client_saw_hello = check_server_hello(client, hello, where);
  const client_answer answer = make_client_answer(client, hello, random_nonce());
  server_verdict verdict{};
  r.server_saw_answer = check_client_answer(server, hello, answer, verdict);
  r.client_saw_verdict = check_server_verdict(client, hello, answer, verdict, where);
  return r;
}

TEST(handshake, members_prove_themselves_to_each_other) {
  const auto r = run(server_id, server_id);
  EXPECT_TRUE(r.client_saw_hello.ok()) << r.client_saw_hello.message;
  EXPECT_TRUE(r.server_saw_answer.ok()) << r.server_saw_answer.message;
  EXPECT_TRUE(r.client_saw_verdict.ok()) << r.client_saw_verdict.message;
}

TEST(handshake, another_jobs_member_is_refused_naming_both_jobs) {
  const handshake_identity other{"ffeeddccbbaa9988", protocol_version, key_of(2)};
  const auto r = run(server_id, other);
  EXPECT_EQ(r.client_saw_hello.status, handshake_status::other_job);
  EXPECT_EQ(r.client_saw_hello.message,
            std::string(where) +
                " belongs to job 00112233aabbccdd, this process's join token is for job "
                "ffeeddccbbaa9988");
  EXPECT_EQ(r.server_saw_answer.status, handshake_status::other_job);
  EXPECT_EQ(r.server_saw_answer.peer_job, "ffeeddccbbaa9988");
  EXPECT_TRUE(contains(r.server_saw_answer.message, "ffeeddccbbaa9988"));
  EXPECT_EQ(r.client_saw_verdict.status, handshake_status::other_job);
}

TEST(handshake, another_protocol_is_refused_naming_both_versions) {
  handshake_identity old = server_id;
  old.protocol = 1;
  const auto r = run(server_id, old);
  EXPECT_EQ(r.client_saw_hello.status, handshake_status::other_protocol);
  EXPECT_EQ(r.client_saw_hello.peer_protocol, protocol_version);
  EXPECT_TRUE(contains(r.client_saw_hello.message,
                       "speaks protocol version " + std::to_string(protocol_version)))
      << r.client_saw_hello.message;
  EXPECT_TRUE(contains(r.client_saw_hello.message, "this troupe build speaks 1"))
      << r.client_saw_hello.message;
  EXPECT_EQ(r.server_saw_answer.status, handshake_status::other_protocol);
  EXPECT_EQ(r.server_saw_answer.peer_protocol, 1);
  EXPECT_TRUE(contains(r.server_saw_answer.message, "protocol version 1"));
}

TEST(handshake, a_wrong_secret_is_refused_both_ways) {
  handshake_identity forged = server_id;
  forged.key = key_of(9);
  // A client that does not hold the secret.
  auto r = run(server_id, forged);
  EXPECT_TRUE(r.client_saw_hello.ok());
  EXPECT_EQ(r.server_saw_answer.status, handshake_status::bad_proof);
  EXPECT_EQ(r.client_saw_verdict.status, handshake_status::bad_proof);
  EXPECT_TRUE(contains(r.client_saw_verdict.message, "refused this process's proof"))
      << r.client_saw_verdict.message;
  // A listener that does not hold it (an impostor on the port) cannot check the client's
  // proof, and a verdict that claims success anyway carries no valid proof of its own.
  r = run(forged, server_id);
  EXPECT_EQ(r.server_saw_answer.status, handshake_status::bad_proof);
  const server_hello hello = make_server_hello(forged, random_nonce());
  const client_answer answer = make_client_answer(server_id, hello, random_nonce());
  server_verdict verdict{};
  check_client_answer(forged, hello, answer, verdict);
  verdict[0] = static_cast<unsigned char>(handshake_status::ok);
  const auto seen = check_server_verdict(server_id, hello, answer, verdict, where);
  EXPECT_EQ(seen.status, handshake_status::bad_proof);
  EXPECT_TRUE(contains(seen.message, "could not prove")) << seen.message;
}

TEST(handshake, an_answer_is_bound_to_its_hello) {
  const server_hello first = make_server_hello(server_id, random_nonce());
  const server_hello second = make_server_hello(server_id, random_nonce());
  const client_answer answer = make_client_answer(server_id, first, random_nonce());
  server_verdict verdict{};
  EXPECT_TRUE(check_client_answer(server_id, first, answer, verdict).ok());
  // Replayed against another connection's challenge.
  EXPECT_EQ(check_client_answer(server_id, second, answer, verdict).status,
            handshake_status::bad_proof);
  EXPECT_NE(verdict[0], 0);
  // Any flipped bit of the answer breaks it.
  for (size_t i = 28; i < client_answer_size; i += 7) {
    client_answer tampered = answer;
    tampered[i] ^= 1;
    EXPECT_FALSE(check_client_answer(server_id, first, tampered, verdict).ok()) << i;
  }
}

TEST(handshake, a_server_proof_is_not_a_client_proof) {
  // Reflection: the server's proof for one transcript must not pass as the client's.
  const server_hello hello = make_server_hello(server_id, random_nonce());
  client_answer answer = make_client_answer(server_id, hello, random_nonce());
  server_verdict verdict{};
  ASSERT_TRUE(check_client_answer(server_id, hello, answer, verdict).ok());
  std::copy(verdict.begin() + 1, verdict.end(), answer.begin() + 60);
  EXPECT_EQ(check_client_answer(server_id, hello, answer, verdict).status,
            handshake_status::bad_proof);
}

TEST(handshake, garbage_is_not_a_troupe_peer) {
  client_answer junk{};
  junk.fill('A');
  server_verdict verdict{};
  const auto seen =
      check_client_answer(server_id, make_server_hello(server_id, random_nonce()), junk, verdict);
  EXPECT_EQ(seen.status, handshake_status::not_troupe);
  EXPECT_EQ(verdict[0], static_cast<unsigned char>(handshake_status::not_troupe));
  server_hello not_hello{};
  not_hello.fill(0);
  EXPECT_EQ(check_server_hello(server_id, not_hello, where).status, handshake_status::not_troupe);
  // What a peer states is printed only in safe characters.
  handshake_identity odd = server_id;
  odd.job_id = std::string("ab\n\x1b[31m", 8);
  const auto r = run(server_id, odd);
  EXPECT_EQ(r.server_saw_answer.peer_job, "ab???31m");
}

TEST(handshake, messages_have_fixed_sizes) {
  EXPECT_EQ(sizeof(server_hello), 60u);
  EXPECT_EQ(sizeof(client_answer), 92u);
  EXPECT_EQ(sizeof(server_verdict), 33u);
  const auto hello = make_server_hello(server_id, random_nonce());
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(hello.data()), 8), handshake_magic);
}

}  // namespace
