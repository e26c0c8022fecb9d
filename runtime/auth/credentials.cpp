#include "runtime/auth/credentials.hpp"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>

namespace troupe::auth {
namespace {

constexpr size_t max_token_bytes = 64 * 1024;
constexpr const char* token_magic = "troupe-join-token 1";

template <class T, void (*Free)(T*)>
struct openssl_deleter {
  void operator()(T* p) const { Free(p); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, openssl_deleter<EVP_PKEY, EVP_PKEY_free>>;
using x509_ptr = std::unique_ptr<X509, openssl_deleter<X509, X509_free>>;
using bio_ptr = std::unique_ptr<BIO, openssl_deleter<BIO, BIO_free_all>>;

std::string hex(const unsigned char* p, size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(digits[p[i] >> 4]);
    s.push_back(digits[p[i] & 15]);
  }
  return s;
}

bool unhex(const std::string& s, std::string& out) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (s.size() % 2 != 0) return false;
  out.clear();
  for (size_t i = 0; i < s.size(); i += 2) {
    int hi = nibble(s[i]), lo = nibble(s[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1)
    throw credentials_error("cannot draw random bytes for the job's credentials (OpenSSL RAND)");
  return out;
}

// A self-signed certificate for the job: every member presents it and trusts nothing else, so
// holding its key is what membership means.
std::string make_certificate_pem(const std::string& job_id, std::string& key_pem) {
  pkey_ptr key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (!key) throw credentials_error("cannot make the job's key (OpenSSL EC P-256)");
  x509_ptr cert(X509_new());
  if (!cert) throw credentials_error("cannot make the job's certificate");
  X509_set_version(cert.get(), 2);
  std::string serial = random_bytes(8);
  uint64_t s = 0;
  for (char c : serial) s = (s << 8) | static_cast<unsigned char>(c);
  ASN1_INTEGER_set_uint64(X509_get_serialNumber(cert.get()), s >> 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 60L * 60 * 24 * 365 * 10);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  const std::string cn = "troupe job " + job_id;
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert.get(), cert.get(), nullptr, nullptr, 0);
  for (auto [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:TRUE"},
                            std::pair{NID_key_usage, "critical,digitalSignature,keyCertSign"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (!ext) throw credentials_error("cannot make the job's certificate extensions");
    X509_add_ext(cert.get(), ext, -1);
    X509_EXTENSION_free(ext);
  }
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) <= 0)
    throw credentials_error("cannot sign the job's certificate");

  auto to_pem = [](auto write) {
    bio_ptr bio(BIO_new(BIO_s_mem()));
    if (!bio || write(bio.get()) != 1)
      throw credentials_error("cannot encode the job's credentials");
    char* data = nullptr;
    long n = BIO_get_mem_data(bio.get(), &data);
    return std::string(data, static_cast<size_t>(n));
  };
  key_pem = to_pem([&](BIO* b) {
    return PEM_write_bio_PrivateKey(b, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  });
  return to_pem([&](BIO* b) { return PEM_write_bio_X509(b, cert.get()); });
}

// Checks that the PEM part holds a certificate and the key that matches it, so that CAF's
// OpenSSL module (which throws from its I/O thread on a bad file) never sees a broken one.
void check_pem(const std::string& path, const std::string& text) {
  bio_ptr cert_bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
  x509_ptr cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  bio_ptr key_bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
  pkey_ptr key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (!cert || !key)
    throw credentials_error("join token " + path +
                            ": its certificate or key is missing or damaged; copy the token "
                            "again from the coordinator's run directory");
  if (X509_check_private_key(cert.get(), key.get()) != 1)
    throw credentials_error("join token " + path + ": its key does not match its certificate");
}

std::mutex process_mutex;
job_credentials process_creds;

}  // namespace

job_credentials create_join_token(const std::string& path) {
  job_credentials c;
  std::string id = random_bytes(8);
  c.job_id = hex(reinterpret_cast<const unsigned char*>(id.data()), id.size());
  c.protocol = protocol_version;
  c.secret = random_bytes(32);
  std::string key_pem;
  const std::string cert_pem = make_certificate_pem(c.job_id, key_pem);
  std::ostringstream text;
  text << token_magic << "\njob " << c.job_id << "\nprotocol " << c.protocol << "\nsecret "
       << hex(reinterpret_cast<const unsigned char*>(c.secret.data()), c.secret.size()) << "\n"
       << cert_pem << key_pem;
  const std::string body = text.str();

  // Written under a temporary name with mode 0600 from its creation, then renamed, so that no
  // moment exists where the secret sits in a file others can read.
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    throw credentials_error("cannot write the join token " + tmp + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < body.size()) {
    ssize_t n = ::write(fd, body.data() + done, body.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw credentials_error("cannot write the join token " + tmp + ": " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw credentials_error("cannot write the join token " + path + ": " + std::strerror(err));
  }
  char* real = ::realpath(path.c_str(), nullptr);
  c.token_path = real ? real : path;
  std::free(real);
  return c;
}

std::string read_private_file(const std::string& path, const std::string& what, size_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw credentials_error("cannot read the " + what + " " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw credentials_error(what + " " + path + " is not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    throw credentials_error(what + " " + path +
                            " can be read or written by other users; it holds a secret. "
                            "Run: chmod 600 " +
                            path);
  }
  if (static_cast<size_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw credentials_error(what + " " + path + " is " + std::to_string(st.st_size) +
                            " bytes; the limit is " + std::to_string(max_bytes) +
                            ". Is this the right file?");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(got);
  return text;
}

std::string read_bearer_token(const std::string& path) {
  std::string text = read_private_file(path, "metrics token", 4096);
  const auto end = text.find_first_of("\r\n");
  if (end != std::string::npos) text.resize(end);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.pop_back();
  size_t start = 0;
  while (start < text.size() && (text[start] == ' ' || text[start] == '\t')) ++start;
  text.erase(0, start);
  if (text.empty())
    throw credentials_error("metrics token " + path +
                            " is empty; its first line is the token Prometheus must send");
  for (unsigned char ch : text)
    if (ch < 0x21 || ch > 0x7e)
      throw credentials_error("metrics token " + path +
                              " holds a character that cannot travel in an HTTP header; use "
                              "printable ASCII without spaces");
  return text;
}

job_credentials load_join_token(const std::string& path) {
  const std::string text = read_private_file(path, "join token", max_token_bytes);
  job_credentials c;
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != token_magic)
    throw credentials_error("join token " + path + " does not start with '" +
                            std::string(token_magic) +
                            "'; it is not a troupe join token (or one of a newer format)");
  std::string secret_hex;
  for (int i = 0; i < 3 && std::getline(in, line); ++i) {
    auto space = line.find(' ');
    const std::string key = line.substr(0, space);
    const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
    if (key == "job")
      c.job_id = value;
    else if (key == "protocol")
      c.protocol = std::atoi(value.c_str());
    else if (key == "secret")
      secret_hex = value;
  }
  if (c.job_id.size() != 16 || !unhex(secret_hex, c.secret) || c.secret.size() != 32 ||
      c.protocol <= 0)
    throw credentials_error("join token " + path +
                            " is damaged (its job, protocol or secret line is missing or "
                            "malformed); copy it again from the coordinator's run directory");
  if (c.protocol != protocol_version)
    throw credentials_error("join token " + path + " is for protocol version " +
                            std::to_string(c.protocol) + ", and this troupe build speaks " +
                            std::to_string(protocol_version) +
                            "; run the same troupe build on every machine of a job");
  check_pem(path, text);
  char* real = ::realpath(path.c_str(), nullptr);
  c.token_path = real ? real : path;
  std::free(real);
  return c;
}

std::array<unsigned char, 32> derive_key(const job_credentials& c, std::string_view purpose) {
  if (!c.valid()) throw credentials_error("derive_key: this process holds no job credentials");
  std::array<unsigned char, 32> out{};
  unsigned int len = 0;
  const std::string label = "troupe key: " + std::string(purpose);
  if (!HMAC(EVP_sha256(), c.secret.data(), static_cast<int>(c.secret.size()),
            reinterpret_cast<const unsigned char*>(label.data()), label.size(), out.data(), &len) ||
      len != out.size())
    throw credentials_error("derive_key: HMAC-SHA256 failed");
  return out;
}

const job_credentials& process_credentials() {
  std::lock_guard lock(process_mutex);
  return process_creds;
}

void set_process_credentials(job_credentials c) {
  std::lock_guard lock(process_mutex);
  process_creds = std::move(c);
}

}  // namespace troupe::auth
