#pragma once
// The public face of troupe's checkpoints: each rank writes the chunks of the boxes it owns,
// the coordinator commits a manifest once every rank's chunks are durable, and a restore reads
// and verifies back what any world size and layout needs.
//
// On disk, as ranks write it (manifest format_version 2, chunk format 2):
//
//   RUN_DIR/checkpoints/LATEST                       "step-00000010\n": the committed one
//   RUN_DIR/checkpoints/step-00000010/manifest.json  written last; its presence + LATEST
//   RUN_DIR/checkpoints/chunks/3f/3f2a...e1          content-addressed chunks (chunk_file.hpp)
//   RUN_DIR/checkpoints/recycled-chunks/             collected chunk files, for overwriting
//   RUN_DIR/checkpoints/damaged/                     quarantined checkpoints, moved-aside objects
//
// The manifest (manifest_v2.cpp has its schema) lists the single-rank model's tensors and,
// for each state array (params, exp_avg, exp_avg_sq) and tensor, the boxes that tile it, each
// with the chunks that hold its floats; besides step, world, seed, AdamW's step count, the
// chunk size, the layout that wrote it and the job config, sealed by manifest_hash. A chunk
// file is a 48-byte header (magic, chunk format, encoding, the payload's byte order, sizes,
// its key) and the raw floats; its name is the XXH3-128 of those floats (chunk_file.hpp).
//
// Format 3 (manifest_v3.cpp) is format 2 for a general workload's state: each tensor has a
// dtype and may sit in one state array ("model", "optim", "extra") only, a non-f32 tensor is
// one row of 4-byte words, and named counters and an extras document replace adam_t. Only a
// manifest whose format_version says 3 is written so; the GPT's stay format 2.
//
// Format 1 (one flat shard per rank, step-NNNNNNNN/shard-RRRRR.bin, format.hpp) is still
// read; no rank writes it any more (write_shard is kept for the tests of that reader).
//
// Every file is written to a temporary name, fsync'ed, renamed into place and its
// directory fsync'ed, so a crash at any point leaves either the old or the new file and
// never a torn one; until LATEST names a step, that step does not exist for a restore.
// Nothing found on disk is trusted: see the "damage" section below and docs/SECURITY.md.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "checkpoint/shard_writer.hpp"
#include "runtime/workload/workload.hpp"

namespace troupe::ckpt {

/// The manifest format the GPT's checkpoints have. Version 2 (chunked, per-box) is what its
/// ranks write, and it stays so: its checkpoints are byte-identical to earlier builds'; version
/// 1 (one flat shard file per rank) still loads.
inline constexpr int format_version = 2;
/// Format 3: format 2 plus what a general workload's state needs (runtime/workload/
/// workload.hpp): per-tensor dtype and state array, named counters, an extras document.
/// Written only for a manifest whose format_version says 3; see required_format_version.
inline constexpr int workload_format_version = 3;
/// The newest manifest format this build reads.
inline constexpr int newest_format_version = workload_format_version;
/// Format 1: its shard files and manifests (read by load_full_state; written by write_shard,
/// which only tests call).
inline constexpr int shard_format_version = 1;

/// A contiguous slice [offset, offset + count) of the global flat state.
struct shard_range {
  size_t offset = 0;
  size_t count = 0;
  friend bool operator==(const shard_range&, const shard_range&) = default;
};

/// Format 1: the slice that `rank` of `world` owns in data parallelism: a balanced split of
/// `global_numel` where the first `global_numel % world` ranks take one extra element.
/// Throws checkpoint_error (invalid_argument) unless 0 <= rank < world.
shard_range owned_range(size_t global_numel, int rank, int world);

/// Format 1: what one rank wrote, its slice of the flat parameters and AdamW moments plus
/// the scalar state needed to continue the run bit-for-bit.
struct shard_state {
  int rank = 0;
  int world = 1;
  int64_t step = 0;    ///< steps completed; the data position is f(seed, step)
  int64_t adam_t = 0;  ///< AdamW bias-correction step count
  uint64_t seed = 0;
  uint64_t rng_state = 0;                          ///< this rank's RNG state
  size_t global_numel = 0;                         ///< N: length of the whole flat layout
  shard_range range;                               ///< the slice this shard holds
  std::vector<float> params, exp_avg, exp_avg_sq;  ///< each range.count long
};

/// Format 1: one committed shard as the manifest records it.
struct shard_entry {
  int rank = 0;
  std::string file;    ///< name inside the step directory, e.g. "shard-00003.bin"
  uint64_t bytes = 0;  ///< whole file size, header included
  std::string hash;    ///< trp64 of the body (everything after the header), 16 hex digits
  shard_range range;
  friend bool operator==(const shard_entry&, const shard_entry&) = default;
};

/// Where one named tensor of the single-rank model lives in the global flat layout, and its
/// shape: what lets a restore cut any layout's boxes out of any other layout's.
struct tensor_entry {
  std::string name;            ///< e.g. "h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;  ///< global shape; numel = product (1 for a scalar)
  size_t offset = 0;           ///< first element (format 3: word) in the flat layout
  /// Format 3: the state array holding it, one of manifest::arrays; "" = in every array (the
  /// only rule formats 1 and 2 know).
  std::string array{};
  /// Format 3: the element type; formats 1 and 2 hold f32 only.
  dtype type = dtype::f32;
  /// 4-byte words its chunks hold: numel for f32, the bytes rounded up to a whole word
  /// otherwise (tensor_decl::words()). Assumes a shape that validation accepted.
  [[nodiscard]] size_t words() const;
  /// [rows, cols] of the view its boxes cut: as_matrix(shape) for f32, [1, words()] for any
  /// other dtype (such a tensor is one row of words, held whole).
  [[nodiscard]] std::pair<int64_t, int64_t> matrix() const;
  friend bool operator==(const tensor_entry&, const tensor_entry&) = default;
};

/// Format 3: the state arrays a workload may name (docs/WORKLOAD.md, "Checkpoint format of a
/// Python job"); a manifest lists the ones it uses, each at most once.
inline constexpr std::array<std::string_view, 3> workload_array_names = {"model", "optim", "extra"};

/// Format 3: a named integer of the state outside any tensor (state_counter's value).
struct counter_entry {
  std::string name;
  int64_t value = 0;
  friend bool operator==(const counter_entry&, const counter_entry&) = default;
};

/// The commit record of one checkpoint: what was saved, by whom, and how to verify it.
struct manifest {
  int format_version = ckpt::format_version;
  int64_t step = 0;
  int world = 1;  ///< the world that wrote it (pieces' ranks, or format 1's shards)
  size_t global_numel = 0;
  uint64_t seed = 0;
  std::string config_json;            ///< the job config, verbatim
  std::vector<tensor_entry> tensors;  ///< version 1: optional; version 2: every tensor
  std::vector<shard_entry> shards;    ///< version 1: one per rank, tiling [0, global_numel)
  // version 2
  int64_t adam_t = 0;               ///< AdamW's step count (every rank agrees)
  uint64_t chunk_floats = 0;        ///< floats per chunk of a piece
  std::string layout;               ///< the layout that wrote it, for people
  std::vector<saved_piece> pieces;  ///< per array and tensor, boxes tiling the tensor
  // version 3 (see workload_format_version); empty in older versions, whose implied values
  // state_arrays() and state_counters() give
  std::vector<std::string> arrays;      ///< a piece's `array` indexes this; workload_array_names
  std::vector<counter_entry> counters;  ///< unique names; adam_t is not used
  std::string extras_json;  ///< a JSON object of at most state_view::max_extras_bytes; "" = none
  friend bool operator==(const manifest&, const manifest&) = default;

  /// The names of the state arrays, which a piece's `array` indexes: `arrays` in format 3,
  /// array_names (params, exp_avg, exp_avg_sq) before.
  [[nodiscard]] std::vector<std::string> state_arrays() const;
  /// The name of state array `index` ("?" outside state_arrays()), for messages.
  [[nodiscard]] std::string array_name(int index) const;
  /// The counters: `counters` in format 3, {"adam_t": adam_t} in format 2, none before.
  [[nodiscard]] std::vector<counter_entry> state_counters() const;
};

/// The oldest manifest format that can say all of `m`: 2 unless a tensor is not f32 or sits in
/// one array only, or `m` has arrays, counters or extras, which only format 3 holds. A writer
/// that is handed general workload state sets format_version to this; commit_manifest refuses
/// a format 2 manifest that holds anything of format 3 rather than drop it.
int required_format_version(const manifest& m);

/// What went wrong, for callers that react differently (retry, fall back, give up).
enum class error_kind {
  invalid_argument,     ///< the caller passed inconsistent state; a bug, not a disk fault
  io,                   ///< the operating system refused (permissions, disk full, ...)
  missing,              ///< a file the checkpoint needs is not there
  truncated,            ///< a file is shorter (or longer) than recorded
  corrupt,              ///< bytes do not match their hash, or a file does not parse
  bad_magic,            ///< not a troupe shard at all
  unsupported_version,  ///< written by a newer troupe
  wrong_endianness,     ///< written on a machine of the other byte order
  mismatch,             ///< a field disagrees with the manifest (rank, step, range, ...)
  incompatible,         ///< a valid checkpoint of a different run or model
  already_committed,    ///< refusing to overwrite a committed checkpoint
};

/// Every failure of this module. what() names the file, what is wrong and what to do.
class checkpoint_error : public std::runtime_error {
 public:
  checkpoint_error(error_kind kind, std::string path, const std::string& message)
      : std::runtime_error(message), kind_(kind), path_(std::move(path)) {}
  /// The category, for programmatic handling.
  [[nodiscard]] error_kind kind() const noexcept { return kind_; }
  /// The file or directory at fault (may be empty for pure argument errors).
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  error_kind kind_;
  std::string path_;
};

/// Format 1, for tests only (ranks write format 2 through a shard_writer, shard_writer.hpp):
/// writes RUN_DIR/checkpoints/step-NNNNNNNN/shard-RRRRR.bin durably (temp name, fsync,
/// rename, directory fsync) and returns the entry a format 1 manifest lists.
/// Throws checkpoint_error: invalid_argument on inconsistent state, already_committed if
/// that step already has a manifest, io if the disk refuses.
shard_entry write_shard(const std::string& run_dir, const shard_state& state);

/// Coordinator side, after every rank reported its pieces: checks the manifest (format 2:
/// the pieces of each array and tensor tile it, and every chunk they name is a regular file;
/// format 1: the ranges tile the layout and each shard file has its recorded size), writes
/// manifest.json durably, then points LATEST at the step atomically. Only after LATEST is
/// renamed into place is the checkpoint committed. Re-committing an identical manifest
/// (a retry after a crash) is allowed; a different one for a committed step is not.
/// `before_write`, when given, is called right before the manifest is renamed into place
/// (after its fsync) and again right before LATEST is, and throws to stop the commit there: a
/// coordinator that may have been deposed while it waited on the disk checks that it still
/// leads.
void commit_manifest(const std::string& run_dir, const manifest& m,
                     const std::function<void()>& before_write = {});

/// The checkpoint LATEST names, or nullopt when nothing was ever committed. Step
/// directories without a manifest (a crash before commit) are ignored. Throws
/// checkpoint_error when LATEST or its manifest is corrupt, or points at nothing.
std::optional<manifest> latest_committed(const std::string& run_dir);

/// The step LATEST names, nullopt when there is no LATEST; reads no manifest. Throws
/// checkpoint_error (corrupt) when LATEST does not hold a step directory's name.
std::optional<int64_t> read_latest_step(const std::string& run_dir);

/// Reads and validates step-NNNNNNNN/manifest.json whether or not LATEST names it.
manifest read_manifest(const std::string& run_dir, int64_t step);

/// Steps whose directory holds a manifest, oldest first, not verified further. The
/// fallback list when LATEST's checkpoint turns out to be damaged.
std::vector<int64_t> list_committed(const std::string& run_dir);

/// The whole flat training state of a checkpoint.
struct full_state {
  int64_t step = 0;
  int64_t adam_t = 0;
  uint64_t seed = 0;
  uint64_t rng_state = 0;                 ///< format 1: rank 0's RNG state; format 2: the seed
  std::vector<uint64_t> rank_rng_states;  ///< format 1: every writing rank's, by old rank
  std::vector<float> params, exp_avg, exp_avg_sq;  ///< each global_numel long
};

/// Reads the whole of checkpoint `m` and assembles the full state, independent of the world
/// size that will use it. Format 2: every chunk, checked against its key (restore_into with
/// full_state_map); it records no RNG state, so rng_state is the seed. Format 1: every
/// shard, its size, header (magic, version, byte order, rank, world, step) and every body
/// byte checked against its hash.
full_state load_full_state(const std::string& run_dir, const manifest& m);

/// The parameters alone of load_full_state (the optimizer's moments are not read): for the
/// commands that use a trained model (export, sample, eval). Format 2 reads only the chunks
/// the parameters lie in, each checked against its key.
std::vector<float> load_full_params(const std::string& run_dir, const manifest& m);

/// What a restore read.
struct restore_stats {
  uint64_t bytes_read = 0;  ///< from the disk or from memory
  size_t chunks_read = 0;
  uint64_t bytes_from_memory = 0;  ///< the part a memory_source supplied
};

/// Where a restore looks for chunks before the disk (a peer's memory). `fetch` fills `out`
/// with one chunk's floats and returns true, or returns false. `prefetch`, when set, is told
/// ahead of the fetches which chunks come next (in the order they will be fetched, a bounded
/// window at a time), so a source can ask for all of them in one round trip. What `fetch`
/// returns is verified against the key and the expected size like a chunk read from disk; a
/// bad answer falls back to the disk.
struct memory_source {
  std::function<void(std::span<const chunk_key> keys)> prefetch;
  std::function<bool(const chunk_key& key, std::vector<float>& out)> fetch;
};

/// Fills `buffers` (array_names order) at every piece of `map` from the format 2 checkpoint
/// `m`, reading and verifying only the chunks that overlap those pieces: any layout restores
/// from any other. Throws checkpoint_error naming the chunk file and tensor on damage.
restore_stats restore_into(const std::string& run_dir, const manifest& m, const state_map& map,
                           std::span<const std::span<float>> buffers,
                           const memory_source& memory = {});

/// A rank's written pieces as compact JSON, for the message that reports them.
std::string encode_pieces(const std::vector<saved_piece>& pieces);
/// Parses what encode_pieces wrote; throws checkpoint_error (corrupt) on anything else.
std::vector<saved_piece> decode_pieces(std::string_view json);

/// The state map of the single-rank model that `m` describes (every tensor whole).
state_map full_state_map(const manifest& m);

/// Format 1, for tests: the part of `full` that `rank` of `world` owns, as a shard ready for
/// write_shard.
shard_state slice_state(const full_state& full, int rank, int world);

/// Throws checkpoint_error (incompatible) unless `m` belongs to this run: the same
/// global_numel and the same config (runtime/config.hpp to_json), compared as JSON values
/// (key order and whitespace do not matter). Keys listed in `ignored` (JSON pointers such as
/// "/world" or "/steps") may differ, e.g. those an elastic restart or a longer schedule
/// changes on purpose.
void require_compatible(const manifest& m, const nlohmann::json& config, size_t global_numel,
                        std::span<const std::string> ignored = {});

/// Which committed checkpoints retention keeps: the newest keep_last (0 = all of them), every
/// step that is a multiple of keep_every (0 = none), and always the one LATEST names.
struct retention_policy {
  size_t keep_last = 0;
  int64_t keep_every = 0;
};

/// What a garbage collection did.
struct gc_result {
  std::vector<int64_t> removed_steps;
  /// Entries of the chunk store and the recycled files that are not what troupe puts there
  /// (links, directories, FIFOs, ...): skipped, never followed, deleted or failed on.
  std::vector<std::string> foreign;
  size_t chunks_kept = 0;
  size_t chunks_removed = 0;   // from the store: deleted, or moved to the recycled files
  size_t chunks_recycled = 0;  // of those, kept as files for the next writes to overwrite
  uint64_t bytes_freed = 0;    // deleted: removed chunks not recycled, and recycled files
  size_t temp_files_removed = 0;
};

/// Applies `policy` (manifests removed first, durably) and then deletes every chunk that no
/// remaining committed or quarantined manifest references, plus chunk temporary files older
/// than `temp_grace` (those of a writer that died). Chunks a writer is adding right now are
/// not referenced yet: call this only when no checkpoint of the run is being written (the
/// coordinator does so between checkpoints; `troupe ckpt gc` refuses while a job holds the
/// run's lock). Retention only removes a checkpoint older than a verified one (see
/// gc_memory::verified), and never the newest verified one: a damaged newer checkpoint never
/// costs the intact one before it. A committed manifest that cannot be read (other than the
/// one LATEST names) is damage: its checkpoint is quarantined, and this collection throws
/// checkpoint_error (corrupt) saying so, deleting nothing; the next one goes on without it.
gc_result collect_garbage(const std::string& run_dir, const retention_policy& policy,
                          std::chrono::seconds temp_grace);

/// What a process that collects the same run again and again remembers between collections:
/// the chunks each committed manifest references, by step. With it, a manifest is parsed once
/// (or never, when its committer records it), and a collection deletes the chunks of the
/// checkpoints it removes instead of listing every chunk folder; every sweep_every-th
/// collection (the first included) still lists them all, for what a dead writer left.
/// Only for the process that alone commits to the run (the job's coordinator).
struct gc_memory {
  std::map<int64_t, std::vector<chunk_key>> references;
  size_t collections = 0;
  size_t sweep_every = 16;
  /// How many collected chunk files to keep for writers to overwrite (chunk_file::
  /// recycled_root); the rest are deleted. 0 deletes every one, recycled files included.
  /// A writer that overwrites a file allocates no pages or blocks and the collection frees
  /// none, which is most of what a checkpoint of state that changes every step costs.
  size_t recycle_up_to = 0;
  /// Steps known intact: committed by this process (whose writers deduplicate only against
  /// chunks known good) or read back whole (a resume's choice). Retention removes only
  /// checkpoints older than the newest of these; when none is known, a collection verifies
  /// from the newest committed checkpoint down until one is intact.
  std::set<int64_t> verified;
  /// The chunks each quarantined checkpoint references, by its directory, read once.
  std::map<std::string, std::vector<chunk_key>> quarantined;
  /// Records the chunks `m` references, as committed.
  void remember(const manifest& m);
};

/// collect_garbage with `memory`: the same result, without re-reading what it holds.
gc_result collect_garbage(const std::string& run_dir, const retention_policy& policy,
                          std::chrono::seconds temp_grace, gc_memory& memory);

/// An exclusive hold on a run directory's checkpoints (flock of RUN_DIR/checkpoints/.lock),
/// kept by a running job for its whole life, so that an offline `troupe ckpt gc` never
/// deletes chunks a job is about to reference. Released on destruction or process death.
class run_lock {
 public:
  /// The lock, or nullopt when another process holds it. Throws checkpoint_error (io) when
  /// the lock file cannot be created.
  static std::optional<run_lock> try_acquire(const std::string& run_dir);
  run_lock(run_lock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  run_lock& operator=(run_lock&&) = delete;
  run_lock(const run_lock&) = delete;
  ~run_lock();

 private:
  explicit run_lock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

/// Removes the temporary files that interrupted writes left behind: names with ".tmp." (the
/// writers' `<final>.tmp.<pid>.<n>`) or ending in ".tmp", directly in RUN_DIR and anywhere under
/// RUN_DIR/checkpoints. Holding `held` (this run's lock) is the proof that no live job is
/// writing any of them. Returns the files removed; one that cannot be removed is left for the
/// next start.
std::vector<std::string> remove_stale_temp_files(const std::string& run_dir, const run_lock& held);

/// The chunk store's lock (flock of RUN_DIR/checkpoints/.chunks.lock): every shard writer
/// holds it shared for the whole of a write, and a garbage collection holds it exclusively,
/// so a collection never deletes a chunk that a writer is adding or deduplicating against.
class chunk_store_lock {
 public:
  /// Waits for a running collection to finish. Throws checkpoint_error (io).
  static chunk_store_lock shared(const std::string& run_dir);
  /// nullopt while any writer holds it. Throws checkpoint_error (io).
  static std::optional<chunk_store_lock> try_exclusive(const std::string& run_dir);
  chunk_store_lock(chunk_store_lock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  chunk_store_lock& operator=(chunk_store_lock&&) = delete;
  chunk_store_lock(const chunk_store_lock&) = delete;
  ~chunk_store_lock();

 private:
  explicit chunk_store_lock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

/// One damaged object found by verify_checkpoint.
struct problem {
  std::string path;     ///< the file at fault
  std::string message;  ///< what is wrong with it and which tensors it holds
  error_kind kind = error_kind::corrupt;
};

// ---- damage: found, moved aside, never deleted -----------------------------------------
//
// The run directory is input like any other: a checkpoint found damaged is moved to
// RUN_DIR/checkpoints/damaged/step-NNNNNNNN-REASON, so that replaying its step commits a fresh
// one and LATEST never names it, and whatever lies in the way of a write (a damaged chunk, a
// link or a directory under a chunk's name, a file where a folder belongs) is moved to
// RUN_DIR/checkpoints/damaged/objects/. Only a process holding the run lock moves checkpoints
// (a job, `troupe ckpt scrub`); writers move single objects.

/// Whether an error of `kind` says the data is damaged. A refusal by the OS, a newer format
/// or another machine's byte order say nothing against it and quarantine nothing.
bool is_damage(error_kind kind);
/// A short name of what is wrong, for a quarantined checkpoint's directory name.
std::string damage_reason(error_kind kind);
/// Whether any of `problems` is damage (see is_damage).
bool any_damage(const std::vector<problem>& problems);

/// Moves committed checkpoint `step` (its whole directory) to
/// RUN_DIR/checkpoints/damaged/step-NNNNNNNN-REASON (with -2, -3, ... when taken), durably, and
/// returns the new path. The chunks it references stay while it is there (garbage collection
/// keeps them); `troupe ckpt ls` lists it. Throws checkpoint_error (io).
std::string quarantine_checkpoint(const std::string& run_dir, int64_t step,
                                  std::string_view reason);

/// A quarantined checkpoint.
struct quarantined_checkpoint {
  int64_t step = 0;
  std::string reason;
  std::string path;
};
/// The quarantined checkpoints, by step (then name).
std::vector<quarantined_checkpoint> list_quarantined(const std::string& run_dir);

/// Moves whatever `path` names (never followed: a link moves as a link) to
/// RUN_DIR/checkpoints/damaged/objects/NAME.REASON.PID.N and returns the new path. Throws
/// checkpoint_error (io) when it cannot be moved.
std::string move_aside(const std::string& run_dir, const std::filesystem::path& path,
                       std::string_view reason);

/// Makes `dir`, at or below RUN_DIR/checkpoints, a real directory, each folder on the way
/// included: a missing one is created (its parent fsync'ed when `durable`), and anything else
/// lying there (a link, a file) is moved aside first. RUN_DIR/checkpoints itself is never
/// moved: a link there is refused (checkpoint_error, io). Returns the new paths of what was
/// moved aside.
std::vector<std::string> make_real_directory(const std::string& run_dir,
                                             const std::filesystem::path& dir, bool durable);

/// Points LATEST at `step` durably, or removes it (durably) when `step` is nullopt. A non-file
/// in LATEST's place is moved aside first. `before_rename`: see io::publish.
void point_latest_at(const std::string& run_dir, std::optional<int64_t> step,
                     const std::function<void()>& before_rename = {});

/// Reads back every object of committed checkpoint `step` (manifest, and every chunk or shard
/// with its hash) and lists each damaged one; empty when the checkpoint is intact.
std::vector<problem> verify_checkpoint(const std::string& run_dir, int64_t step);

}  // namespace troupe::ckpt
