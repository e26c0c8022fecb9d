// The in-memory replica server: a put with the job's token is held and served; a request
// without it, of the wrong shape, damaged, or larger than a chunk is refused and changes
// nothing; garbage frames never take the server down; one source's two newest steps are kept.

#include <gtest/gtest.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "checkpoint/replica_store.hpp"

namespace troupe::ckpt {
namespace {

using namespace std::chrono_literals;

std::vector<unsigned char> bytes_of(std::vector<float> v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  return {p, p + v.size() * sizeof(float)};
}

chunk_key key_for(const std::vector<unsigned char>& b) { return key_of(b.data(), b.size()); }

TEST(ReplicaStore, HoldsWhatTheJobPutsAndRefusesStrangers) {
  const replica_token token = random_replica_token();
  replica_server server("127.0.0.1", token, 1024);
  replica_client client(token, 2s);
  const auto a = bytes_of({1, 2, 3});
  EXPECT_TRUE(client.put(server.endpoint(), 0, 5, key_for(a), a));
  EXPECT_EQ(client.get(server.endpoint(), key_for(a)), a);
  EXPECT_EQ(server.bytes_held(), a.size());

  replica_token other = token;
  other[0] ^= 1;
  replica_client stranger(other, 2s);
  const auto b = bytes_of({4, 5});
  EXPECT_FALSE(stranger.put(server.endpoint(), 0, 5, key_for(b), b)) << "wrong token";
  EXPECT_FALSE(stranger.get(server.endpoint(), key_for(a))) << "wrong token reads nothing";
  EXPECT_FALSE(client.put(server.endpoint(), 0, 5, key_for(a), b)) << "bytes not matching the key";
  const auto big = bytes_of(std::vector<float>(1000, 1.0f));
  EXPECT_FALSE(client.put(server.endpoint(), 0, 5, key_for(big), big)) << "larger than a chunk";
  EXPECT_EQ(server.bytes_held(), a.size());

  // Garbage of every shape from a raw socket: answered or dropped, never a crash.
  zmq::context_t ctx;
  for (int shape = 0; shape < 6; ++shape) {
    zmq::socket_t raw(ctx, zmq::socket_type::req);
    raw.set(zmq::sockopt::linger, 0);
    raw.set(zmq::sockopt::rcvtimeo, 500);
    raw.connect(server.endpoint());
    std::vector<zmq::message_t> frames;
    for (int f = 0; f <= shape; ++f)
      frames.emplace_back(std::string(static_cast<size_t>(f * 7), 'x'));
    ASSERT_TRUE(zmq::send_multipart(raw, frames));
    std::vector<zmq::message_t> reply;
    (void)zmq::recv_multipart(raw, std::back_inserter(reply));
  }
  EXPECT_EQ(client.get(server.endpoint(), key_for(a)), a) << "still serving";
}

TEST(ReplicaStore, ManyChunksInOneRequestAndTheServersOwnProcessReadsWithoutOne) {
  const replica_token token = random_replica_token();
  replica_server server("127.0.0.1", token, 1024);
  replica_client client(token, 2s);
  const auto a = bytes_of({1, 2, 3});
  const auto b = bytes_of({4, 5});
  ASSERT_TRUE(client.put(server.endpoint(), 0, 5, key_for(a), a));
  ASSERT_TRUE(client.put(server.endpoint(), 0, 5, key_for(b), b));
  const auto missing = bytes_of({9});
  const std::vector<chunk_key> keys = {key_for(b), key_for(missing), key_for(a)};
  const auto got = client.get_many(server.endpoint(), keys);
  ASSERT_TRUE(got);
  ASSERT_EQ(got->size(), 3u);
  EXPECT_EQ((*got)[0], (std::vector<float>{4, 5}));
  EXPECT_TRUE((*got)[1].empty()) << "not held";
  EXPECT_EQ((*got)[2], (std::vector<float>{1, 2, 3}));
  // A full batch passes the server's size limit even when chunks are small.
  const std::vector<chunk_key> full(max_batch_keys, key_for(a));
  const auto all = client.get_many(server.endpoint(), full);
  ASSERT_TRUE(all);
  EXPECT_EQ(all->back(), (std::vector<float>{1, 2, 3}));
  // Too many keys, none, or the wrong token: refused, and the server goes on serving.
  const std::vector<chunk_key> too_many(max_batch_keys + 1, key_for(a));
  EXPECT_FALSE(client.get_many(server.endpoint(), too_many));
  EXPECT_FALSE(client.get_many(server.endpoint(), {}));
  replica_token other = token;
  other[3] ^= 1;
  replica_client stranger(other, 2s);
  EXPECT_FALSE(stranger.get_many(server.endpoint(), keys));
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::req);
  raw.set(zmq::sockopt::linger, 0);
  raw.set(zmq::sockopt::rcvtimeo, 2000);
  raw.connect(server.endpoint());
  std::vector<zmq::message_t> odd;  // keys that are not a whole number of 16 bytes
  odd.emplace_back(token.data(), token.size());
  odd.emplace_back("M", 1);
  odd.emplace_back(std::string(17, 'k'));
  ASSERT_TRUE(zmq::send_multipart(raw, odd));
  std::vector<zmq::message_t> reply;
  ASSERT_TRUE(zmq::recv_multipart(raw, std::back_inserter(reply)));
  ASSERT_EQ(reply.size(), 1u);
  EXPECT_EQ(reply[0].to_string(), "no");

  std::vector<float> out;
  EXPECT_TRUE(server.holds(key_for(a)));
  EXPECT_TRUE(server.copy_out(key_for(a), out));
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3}));
  EXPECT_FALSE(server.holds(key_for(missing)));
  EXPECT_FALSE(server.copy_out(key_for(missing), out));
}

TEST(ReplicaStore, OneAnswerCarriesNoMoreThanItsBound) {
  const replica_token token = random_replica_token();
  const auto a = bytes_of({1, 2, 3, 4});  // 16 bytes
  replica_server server("127.0.0.1", token, 1024, /*max_reply_bytes=*/40);
  replica_client client(token, 2s);
  ASSERT_TRUE(client.put(server.endpoint(), 0, 5, key_for(a), a));
  const std::vector<chunk_key> keys(3, key_for(a));
  const auto got = client.get_many(server.endpoint(), keys);
  ASSERT_TRUE(got);
  EXPECT_EQ((*got)[0].size(), 4u);
  EXPECT_EQ((*got)[1].size(), 4u);
  EXPECT_TRUE((*got)[2].empty()) << "past 40 bytes: answered as not held";
}

TEST(ReplicaStore, KeepsEachSourcesTwoNewestSteps) {
  const replica_token token = random_replica_token();
  replica_server server("127.0.0.1", token, 1024);
  replica_client client(token, 2s);
  std::vector<std::vector<unsigned char>> chunks;
  for (int step = 1; step <= 3; ++step) {
    chunks.push_back(bytes_of({static_cast<float>(step)}));
    ASSERT_TRUE(client.put(server.endpoint(), 7, step, key_for(chunks.back()), chunks.back()));
  }
  EXPECT_FALSE(client.get(server.endpoint(), key_for(chunks[0]))) << "step 1 was dropped";
  EXPECT_TRUE(client.get(server.endpoint(), key_for(chunks[1])));
  EXPECT_TRUE(client.get(server.endpoint(), key_for(chunks[2])));
  EXPECT_EQ(server.bytes_held(), 2 * sizeof(float));
}

TEST(ReplicaStore, AnUnreachableServerIsAnAnswerNotAHang) {
  replica_client client(random_replica_token(), 300ms);
  const auto a = bytes_of({1});
  EXPECT_FALSE(client.put("tcp://127.0.0.1:1", 0, 1, key_for(a), a));
  EXPECT_FALSE(client.get("tcp://127.0.0.1:1", key_for(a)));
}

}  // namespace
}  // namespace troupe::ckpt
