// safetensors files (Hugging Face's format, what timm and transformers load) and sharded
// checkpoints with a `model.safetensors.index.json`, written atomically.
//
// File layout: an 8-byte little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "F32"|"BF16"|"F16"|"I32", "shape": [...], "data_offsets": [b, e]}, ...,
//    "__metadata__": {"<key>": "<string>", ...}}
// padded with spaces to a multiple of 8, then the tensors' bytes (little-endian, row-major),
// offsets relative to the end of the header. Reading checks everything a corrupt or truncated
// file could get wrong (header length beyond the file, bad JSON, unknown dtype, offsets out of
// range, overlapping or not covering the data, shape and dtype disagreeing with the byte count)
// and names the file and the tensor.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "cai/core/tensor.h"

namespace cai::checkpoint {

using Metadata = std::map<std::string, std::string>;

// Tensors on any device and of any dtype are written as they are (CUDA tensors copied to the
// host first); names in map order. Not atomic by itself: see AtomicDir.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const Metadata& metadata = {});

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  // CPU tensors
  Metadata metadata;
};
SafetensorsFile load_safetensors(const std::string& path);
// The same from bytes in memory (`origin` names them in errors): what fuzzers drive.
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& origin);

// Hugging Face sharding: tensors in map order into files of at most max_shard_bytes of data each
// (a single tensor larger than that gets a file of its own): `model.safetensors` when one file
// suffices, else `model-00001-of-0000K.safetensors`... plus `model.safetensors.index.json`
// {"metadata": {"total_size": bytes}, "weight_map": {name: file}}. Returns the files written.
std::vector<std::string> save_sharded(const std::string& dir,
                                      const std::map<std::string, Tensor>& tensors,
                                      int64_t max_shard_bytes, const Metadata& metadata = {});
// A safetensors file, or a directory holding model.safetensors or an index (every file of the
// weight map read and checked against it).
SafetensorsFile load_model_weights(const std::string& path);

// fsync a file (or a directory, for the names in it); errors name the path.
void fsync_path(const std::string& path, bool directory);

// A directory written atomically: files go into a temporary sibling (`tmp_path`, or
// "<final>.tmp-<pid>"), which the constructor empties; commit() flushes and fsyncs every file and
// the directory, then renames it to `final`. `final` existing already is an error, unless
// `replace`: then the old one is renamed aside and removed only after the new one is in place.
// Destroyed without commit(): the temporary goes.
class AtomicDir {
 public:
  explicit AtomicDir(std::string final_path, std::string tmp_path = {}, bool replace = false);
  ~AtomicDir();
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;
  const std::string& path() const { return tmp_; }  // where to write
  // fsyncs every file written so far: a marker written after this (the checkpoint's
  // trainer_state.json) means the rest is on disk, even if the process dies before commit().
  void flush_files();
  void commit();

 private:
  std::string final_, tmp_;
  bool replace_ = false, committed_ = false;
};

}  // namespace cai::checkpoint
