#include "runtime/data/dataset.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "runtime/data/random.hpp"
#include "runtime/data/token_sidecar.hpp"

namespace troupe {

class token_source {
 public:
  virtual ~token_source() = default;
  const uint8_t* base = nullptr;  ///< token 0's first byte
  uint64_t tokens = 0;
  int width = 1;
  int64_t vocab = 256;
  std::string path;
  std::string sidecar;  ///< where vocab came from, for the message; "" for text
};

namespace {

// Stream tags keep the training and validation hashes independent for equal (seed, index).
constexpr uint64_t train_stream = 0x7472'6169'6eULL;  // "train"
constexpr uint64_t val_stream = 0x76'616cULL;         // "val"

void check_fill_args(int first_sample, int count, int T) {
  if (first_sample < 0 || count < 0 || T <= 0) {
    throw std::invalid_argument("token_dataset: need first_sample >= 0, count >= 0 and T > 0");
  }
}

// Tokens a test made up, owned here.
struct memory_source final : token_source {
  std::vector<uint8_t> bytes;
  std::vector<token_id> ids;
};

// A file mapped read-only: the workers of a node share its pages through the page cache,
// and only the windows a step reads are ever faulted in.
struct mapped_source final : token_source {
  void* map = nullptr;
  size_t length = 0;
  ~mapped_source() override {
    if (map != nullptr) ::munmap(map, length);
  }
};

std::shared_ptr<const token_source> map_corpus(const corpus_file& file) {
  auto src = std::make_shared<mapped_source>();
  src->path = file.path;
  src->width = file.width;
  src->vocab = file.vocab;
  src->tokens = file.tokens;
  if (file.token_file) src->sidecar = token_sidecar_path(file.path);
  const int fd = ::open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw data_error("cannot open corpus '" + file.path + "' (" + std::strerror(errno) +
                     "): check the path and its permissions");
  src->length = static_cast<size_t>(file.tokens) * static_cast<size_t>(file.width);
  void* map = ::mmap(nullptr, src->length, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (map == MAP_FAILED)
    throw data_error("cannot map corpus '" + file.path + "' into memory (" + std::strerror(err) +
                     ")");
  // Windows are read at random offsets: no read-ahead and no fault-around, so a step maps
  // the pages of its windows and nothing more.
  ::madvise(map, src->length, MADV_RANDOM);
  src->map = map;
  src->base = static_cast<const uint8_t*>(map);
  return src;
}

// Widens tokens [offset, offset + n) of `src` into `out`, refusing an id the vocabulary
// does not hold.
void read_tokens(const token_source& src, size_t offset, size_t n, token_id* out) {
  token_id worst = 0;
  if (src.width == 1) {
    const uint8_t* p = src.base + offset;
    for (size_t i = 0; i < n; ++i) out[i] = p[i];
  } else if (src.width == 2) {
    const uint8_t* p = src.base + 2 * offset;
    for (size_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);  // little-endian on every machine troupe builds for
      out[i] = v;
      worst = std::max<token_id>(worst, v);
    }
  } else {
    const uint8_t* p = src.base + 4 * offset;
    for (size_t i = 0; i < n; ++i) {
      uint32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      out[i] = v;
      worst = std::max<token_id>(worst, v);
    }
  }
  if (static_cast<int64_t>(worst) < src.vocab) return;
  for (size_t i = 0; i < n; ++i)
    if (static_cast<int64_t>(out[i]) >= src.vocab)
      throw data_error("token file '" + src.path + "': token " + std::to_string(offset + i) +
                       " is " + std::to_string(out[i]) + ", not below the vocabulary size " +
                       std::to_string(src.vocab) + " of its sidecar '" + src.sidecar +
                       "'; the file does not match its sidecar: write both again (troupe "
                       "tokenize) or correct vocab_size");
}

}  // namespace

corpus_file describe_corpus(const std::string& path) {
  namespace fs = std::filesystem;
  corpus_file file;
  file.path = path;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (!fs::exists(status))
    throw data_error("corpus '" + path +
                     "' not found; check the path (--data, --val-data), or build the default "
                     "corpus with scripts/make_corpus.sh");
  if (!fs::is_regular_file(status))
    throw data_error("corpus '" + path + "' is not a regular file (" +
                     (fs::is_directory(status) ? std::string("a directory")
                                               : std::string("a device, pipe or socket")) +
                     "); give a text file or a token file with its .json sidecar");
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) throw data_error("corpus '" + path + "': cannot read its size (" + ec.message() + ")");
  const std::string sidecar = token_sidecar_path(path);
  if (!fs::exists(sidecar, ec)) {
    // nanoGPT's train.bin read as text would train without a word of complaint on its ids'
    // bytes: a .bin file is a token file, and needs the sidecar that says its width.
    if (fs::path(path).extension() == ".bin")
      throw data_error("token file '" + path + "' has no sidecar '" + sidecar +
                       "' saying its dtype and vocabulary; write one, e.g. {\"format\": "
                       "\"troupe.tokens\", \"version\": 1, \"dtype\": \"uint16\", "
                       "\"vocab_size\": 50257, \"tokens\": " +
                       std::to_string(size / 2) +
                       ", \"tokenizer\": \"\"} (README: Training on token files), or "
                       "rename the file if it is text");
    if (size == 0) throw data_error("corpus '" + path + "' is empty; give a non-empty file");
    file.tokens = size;
    return file;
  }
  const token_sidecar meta = read_token_sidecar(sidecar);
  file.token_file = true;
  file.width = token_width(meta.dtype);
  file.vocab = meta.vocab_size;
  if (!meta.tokenizer.empty())
    file.tokenizer = fs::absolute(fs::path(sidecar).parent_path() / meta.tokenizer).string();
  if (size == 0) throw data_error("token file '" + path + "' is empty; it holds no tokens");
  if (size % static_cast<uintmax_t>(file.width) != 0)
    throw data_error("token file '" + path + "' has " + std::to_string(size) +
                     " bytes, not a multiple of " + std::to_string(file.width) +
                     " (the width of its sidecar's dtype " +
                     std::string(token_dtype_name(meta.dtype)) +
                     "): it is cut short or not the file its sidecar describes");
  file.tokens = size / static_cast<uintmax_t>(file.width);
  if (static_cast<uint64_t>(meta.tokens) != file.tokens)
    throw data_error("token file '" + path + "' holds " + std::to_string(file.tokens) +
                     " tokens, its sidecar '" + sidecar + "' says " + std::to_string(meta.tokens) +
                     ": one of them was changed or cut short");
  return file;
}

token_dataset::token_dataset(std::shared_ptr<const token_source> train, size_t train_size,
                             std::shared_ptr<const token_source> val, size_t val_begin,
                             size_t val_size)
    : train_(std::move(train)),
      val_(std::move(val)),
      train_size_(train_size),
      val_begin_(val_begin),
      val_size_(val_size) {}

int64_t token_dataset::vocab() const { return train_->vocab; }
const std::string& token_dataset::path() const { return train_->path; }

namespace {

void check_val_fraction(double val_fraction, const std::string& name) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    throw data_error("val_fraction must lie in [0, 1) for corpus '" + name + "', got " +
                     std::to_string(val_fraction));
  }
}

size_t held_out(uint64_t tokens, double val_fraction) {
  return static_cast<size_t>(std::floor(static_cast<double>(tokens) * val_fraction));
}

}  // namespace

token_dataset token_dataset::open(const std::string& path, double val_fraction, int context,
                                  const std::string& val_path) {
  const corpus_file train_file = describe_corpus(path);
  auto train = map_corpus(train_file);
  std::shared_ptr<const token_source> val = train;
  size_t train_size = train->tokens, val_begin = 0, val_size = 0;
  if (val_path.empty()) {
    check_val_fraction(val_fraction, path);
    val_size = held_out(train->tokens, val_fraction);
    train_size = train->tokens - val_size;
    val_begin = train_size;
  } else {
    const corpus_file val_file = describe_corpus(val_path);
    if (val_file.vocab != train_file.vocab || val_file.width != train_file.width)
      throw data_error("validation corpus '" + val_path + "' (vocabulary " +
                       std::to_string(val_file.vocab) + ", " + std::to_string(val_file.width) +
                       "-byte tokens) does not match training corpus '" + path + "' (vocabulary " +
                       std::to_string(train_file.vocab) + ", " + std::to_string(train_file.width) +
                       "-byte tokens); give the validation file made with the same tokenizer");
    val = map_corpus(val_file);
    val_size = val->tokens;
  }
  token_dataset d(std::move(train), train_size, std::move(val), val_begin, val_size);
  if (context > 0) {
    const size_t need = static_cast<size_t>(context) + 1;
    if (d.train_size() < need || d.val_size() < need) {
      throw data_error("corpus '" + path + "' is too small: its training split has " +
                       std::to_string(d.train_size()) + " tokens and its validation split " +
                       std::to_string(d.val_size()) +
                       ", each needs at least context + 1 = " + std::to_string(need) +
                       "; use a larger file, a smaller model.context or another val_fraction");
    }
  }
  return d;
}

token_dataset token_dataset::from_bytes(std::vector<uint8_t> bytes, double val_fraction,
                                        std::string name) {
  check_val_fraction(val_fraction, name);
  if (bytes.empty()) throw data_error("corpus '" + name + "' is empty: give a non-empty text file");
  auto src = std::make_shared<memory_source>();
  src->bytes = std::move(bytes);
  src->base = src->bytes.data();
  src->tokens = src->bytes.size();
  src->path = std::move(name);
  const size_t val = held_out(src->tokens, val_fraction);
  const size_t split = src->tokens - val;
  std::shared_ptr<const token_source> shared = src;
  return token_dataset(shared, split, shared, split, val);
}

token_dataset token_dataset::from_tokens(std::vector<token_id> tokens, int64_t vocab,
                                         double val_fraction, std::string name) {
  check_val_fraction(val_fraction, name);
  if (tokens.empty()) throw data_error("corpus '" + name + "' is empty");
  auto src = std::make_shared<memory_source>();
  src->ids = std::move(tokens);
  src->base = reinterpret_cast<const uint8_t*>(src->ids.data());
  src->tokens = src->ids.size();
  src->width = 4;
  src->vocab = vocab;
  src->path = std::move(name);
  src->sidecar = "<memory>";
  const size_t val = held_out(src->tokens, val_fraction);
  const size_t split = src->tokens - val;
  std::shared_ptr<const token_source> shared = src;
  return token_dataset(shared, split, shared, split, val);
}

size_t token_dataset::window_offset(uint64_t h, size_t begin, size_t size, int T,
                                    const char* split) const {
  const size_t window = static_cast<size_t>(T) + 1;
  if (size < window) {
    throw data_error("corpus '" + path() + "': the " + split + " split has " +
                     std::to_string(size) + " tokens, fewer than a window of T + 1 = " +
                     std::to_string(window) + "; use a larger file or a smaller context");
  }
  // Modulo bias is below size / 2^64: irrelevant for any corpus a disk holds.
  return begin + static_cast<size_t>(h % (size - window + 1));
}

size_t token_dataset::train_offset(uint64_t seed, int64_t step, int i, int T) const {
  const uint64_t h =
      hash_words(seed, train_stream, static_cast<uint64_t>(step), static_cast<uint64_t>(i));
  return window_offset(h, 0, train_size_, T, "training");
}

size_t token_dataset::val_offset(uint64_t seed, int batch, int i, int T) const {
  const uint64_t h =
      hash_words(seed, val_stream, static_cast<uint64_t>(batch), static_cast<uint64_t>(i));
  return window_offset(h, val_begin_, val_size_, T, "validation");
}

void token_dataset::fill(const token_source& from, size_t offset, int T, token_id* inputs,
                         token_id* targets) const {
  // One read of the T + 1 window; inputs are its first T ids and targets its last T.
  read_tokens(from, offset, static_cast<size_t>(T), inputs);
  std::memcpy(targets, inputs + 1, (static_cast<size_t>(T) - 1) * sizeof(token_id));
  read_tokens(from, offset + static_cast<size_t>(T), 1, targets + T - 1);
}

void token_dataset::read(uint64_t offset, size_t n, token_id* out) const {
  if (offset > train_->tokens || n > train_->tokens - offset)
    throw std::out_of_range("token_dataset::read past the end of '" + path() + "'");
  read_tokens(*train_, static_cast<size_t>(offset), n, out);
}

void token_dataset::fill_train(uint64_t seed, int64_t step, int first_sample, int count, int T,
                               token_id* inputs, token_id* targets) const {
  check_fill_args(first_sample, count, T);
  for (int s = 0; s < count; ++s) {
    const size_t at = static_cast<size_t>(s) * static_cast<size_t>(T);
    fill(*train_, train_offset(seed, step, first_sample + s, T), T, inputs + at, targets + at);
  }
}

void token_dataset::fill_val(uint64_t seed, int batch, int first_sample, int count, int T,
                             token_id* inputs, token_id* targets) const {
  check_fill_args(first_sample, count, T);
  for (int s = 0; s < count; ++s) {
    const size_t at = static_cast<size_t>(s) * static_cast<size_t>(T);
    fill(*val_, val_offset(seed, batch, first_sample + s, T), T, inputs + at, targets + at);
  }
}

}  // namespace troupe
