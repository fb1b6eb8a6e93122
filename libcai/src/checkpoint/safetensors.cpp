#include "cai/checkpoint/safetensors.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "cai/core/error.h"

namespace cai::checkpoint {

namespace fs = std::filesystem;

namespace {

const char* st_dtype(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
  }
  return "F32";
}

bool parse_dtype(const std::string& s, DType* t) {
  if (s == "F32")
    *t = DType::F32;
  else if (s == "BF16")
    *t = DType::BF16;
  else if (s == "F16")
    *t = DType::F16;
  else if (s == "I32")
    *t = DType::I32;
  else
    return false;
  return true;
}

constexpr uint64_t kMaxHeader = 100ull << 20;  // the Rust reader's limit

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  CAI_CHECK(f.good(), "[safetensors] cannot open {}", path);
  std::ostringstream s;
  s << f.rdbuf();
  CAI_CHECK(!f.bad(), "[safetensors] error reading {}", path);
  return s.str();
}

}  // namespace

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const Metadata& metadata) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    CAI_CHECK(t.defined(), "[safetensors] {}: tensor '{}' is undefined", path, name);
    CAI_CHECK(name != "__metadata__", "[safetensors] {}: '__metadata__' is not a tensor name",
              path);
    header[name] = {{"dtype", st_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {off, off + t.nbytes()}}};
    off += t.nbytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  CAI_CHECK(f.good(), "[safetensors] cannot write {}", path);
  uint64_t n = h.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  f.write(reinterpret_cast<const char*>(len), 8);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& [name, t] : tensors) {
    const Tensor host = t.is_cuda() ? t.to(Device::cpu()) : t;
    f.write(static_cast<const char*>(host.raw()), static_cast<std::streamsize>(host.nbytes()));
  }
  f.flush();
  CAI_CHECK(f.good(), "[safetensors] error writing {} ({} bytes of tensors)", path, off);
}

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& origin) {
  CAI_CHECK(bytes.size() >= 8, "[safetensors] {}: {} bytes, shorter than the 8-byte header length",
            origin, bytes.size());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  CAI_CHECK(n <= kMaxHeader && n <= bytes.size() - 8,
            "[safetensors] {}: header length {} goes beyond the file ({} bytes) or the {} byte "
            "limit",
            origin, n, bytes.size(), kMaxHeader);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(n));
  } catch (const nlohmann::json::exception& e) {
    fail("[safetensors] {}: the header is not valid JSON ({})", origin, e.what());
  }
  CAI_CHECK(header.is_object(), "[safetensors] {}: the header is not a JSON object", origin);
  const uint64_t data_size = bytes.size() - 8 - n;
  const char* data = bytes.data() + 8 + n;
  SafetensorsFile out;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& e = it.value();
    if (name == "__metadata__") {
      CAI_CHECK(e.is_object(), "[safetensors] {}: __metadata__ is not an object", origin);
      for (auto m = e.begin(); m != e.end(); ++m) {
        CAI_CHECK(m.value().is_string(),
                  "[safetensors] {}: __metadata__ value of '{}' is not a "
                  "string",
                  origin, m.key());
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    CAI_CHECK(
        e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"),
        "[safetensors] {}: tensor '{}' needs dtype, shape and data_offsets", origin, name);
    DType t = DType::F32;
    CAI_CHECK(e["dtype"].is_string() && parse_dtype(e["dtype"].get<std::string>(), &t),
              "[safetensors] {}: tensor '{}' has dtype {} (supported: F32, BF16, F16, I32)", origin,
              name, e["dtype"].dump());
    CAI_CHECK(e["shape"].is_array(), "[safetensors] {}: tensor '{}' shape is not an array", origin,
              name);
    Shape shape;
    uint64_t numel = 1;  // at most 2^62, every dimension an int64_t
    for (const auto& d : e["shape"]) {
      CAI_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                "[safetensors] {}: tensor '{}' has a bad dimension {}", origin, name, d.dump());
      const uint64_t v = d.get<uint64_t>();
      CAI_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) &&
                    (v == 0 || numel <= (uint64_t{1} << 62) / v),
                "[safetensors] {}: tensor '{}' shape {} overflows", origin, name,
                e["shape"].dump());
      numel *= v;
      shape.push_back(static_cast<int64_t>(v));
    }
    const auto& o = e["data_offsets"];
    CAI_CHECK(
        o.is_array() && o.size() == 2 && o[0].is_number_unsigned() && o[1].is_number_unsigned(),
        "[safetensors] {}: tensor '{}' data_offsets {} is not [begin, end]", origin, name,
        o.dump());
    const uint64_t b = o[0].get<uint64_t>(), en = o[1].get<uint64_t>();
    CAI_CHECK(b <= en && en <= data_size,
              "[safetensors] {}: tensor '{}' data_offsets [{}, {}] outside the {} data bytes",
              origin, name, b, en, data_size);
    // The byte count in checked arithmetic: 2^62 F32 elements are 2^64 bytes, which wrap to 0.
    uint64_t nbytes = 0;
    const bool fits = !__builtin_mul_overflow(numel, uint64_t{dtype_size(t)}, &nbytes);
    CAI_CHECK(fits && en - b == nbytes,
              "[safetensors] {}: tensor '{}' is {} {} ({}) but its data_offsets span {} bytes",
              origin, name, dtype_name(t), e["shape"].dump(),
              fits ? fmt::format("{} bytes", nbytes)
                   : fmt::format("{} elements of {} bytes: more than 2^64", numel, dtype_size(t)),
              en - b);
    spans.emplace_back(b, en);
    Tensor x = Tensor::empty(shape, t);
    if (en > b) std::memcpy(x.raw(), data + b, en - b);
    out.tensors.emplace(name, std::move(x));
  }
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (const auto& [b, e] : spans) {
    CAI_CHECK(b == at,
              "[safetensors] {}: tensor data {} at byte {} (expected contiguous data from "
              "0, tensors neither overlapping nor leaving holes)",
              origin, b < at ? "overlaps" : "has a hole", std::min(b, at));
    at = e;
  }
  CAI_CHECK(at == data_size, "[safetensors] {}: {} data bytes but the tensors cover {}", origin,
            data_size, at);
  return out;
}

SafetensorsFile load_safetensors(const std::string& path) {
  return parse_safetensors(read_file(path), path);
}

std::vector<std::string> save_sharded(const std::string& dir,
                                      const std::map<std::string, Tensor>& tensors,
                                      int64_t max_shard_bytes, const Metadata& metadata) {
  CAI_CHECK(max_shard_bytes > 0, "[safetensors] shard size {} must be positive", max_shard_bytes);
  std::vector<std::map<std::string, Tensor>> shards(1);
  int64_t cur = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t b = static_cast<int64_t>(t.nbytes());
    if (cur > 0 && cur + b > max_shard_bytes) shards.emplace_back(), cur = 0;
    shards.back().emplace(name, t);
    cur += b;
    total += b;
  }
  std::vector<std::string> files;
  std::error_code ec;
  fs::create_directories(dir, ec);
  CAI_CHECK(!ec, "[safetensors] cannot create the directory {}: {}", dir, ec.message());
  if (shards.size() == 1) {
    save_safetensors(dir + "/model.safetensors", shards[0], metadata);
    return {"model.safetensors"};
  }
  nlohmann::json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = nlohmann::json::object();
  const size_t k = shards.size();
  for (size_t i = 0; i < k; ++i) {
    const std::string f = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, k);
    save_safetensors(dir + "/" + f, shards[i], metadata);
    for (const auto& [name, t] : shards[i]) index["weight_map"][name] = f;
    files.push_back(f);
  }
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::ofstream idx(index_path);
  CAI_CHECK(idx.good(), "[safetensors] cannot write {}", index_path);
  idx << index.dump(2) << "\n";
  idx.close();  // a write the buffer held fails here (a full disk): the index would be cut short
  CAI_CHECK(!idx.fail(), "[safetensors] error writing {} (the index of {} shards)", index_path, k);
  files.push_back("model.safetensors.index.json");
  return files;
}

SafetensorsFile load_model_weights(const std::string& path) {
  if (!fs::is_directory(path)) return load_safetensors(path);
  const std::string single = path + "/model.safetensors";
  const std::string index_path = path + "/model.safetensors.index.json";
  if (fs::exists(single) && !fs::exists(index_path)) return load_safetensors(single);
  CAI_CHECK(fs::exists(index_path),
            "[checkpoint] {} holds neither model.safetensors nor model.safetensors.index.json",
            path);
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_file(index_path));
  } catch (const nlohmann::json::exception& e) {
    fail("[checkpoint] {}: not valid JSON ({})", index_path, e.what());
  }
  CAI_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
            "[checkpoint] {}: no weight_map object", index_path);
  std::map<std::string, std::vector<std::string>> by_file;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    CAI_CHECK(it.value().is_string(), "[checkpoint] {}: weight_map['{}'] is not a file name",
              index_path, it.key());
    const std::string f = it.value().get<std::string>();
    CAI_CHECK(f.find('/') == std::string::npos && f != ".." && !f.empty(),
              "[checkpoint] {}: weight_map['{}'] = '{}' is not a file of that directory",
              index_path, it.key(), f);
    by_file[f].push_back(it.key());
  }
  SafetensorsFile out;
  int64_t total = 0;
  for (const auto& [f, names] : by_file) {
    SafetensorsFile part = load_safetensors(path + "/" + f);
    for (const std::string& n : names) {
      auto t = part.tensors.find(n);
      CAI_CHECK(t != part.tensors.end(), "[checkpoint] {}: '{}' should be in {} but is not",
                index_path, n, f);
      total += static_cast<int64_t>(t->second.nbytes());
      out.tensors[n] = t->second;
    }
    CAI_CHECK(part.tensors.size() == names.size(),
              "[checkpoint] {}: {} holds {} tensors, the weight map lists {}", index_path, f,
              part.tensors.size(), names.size());
    for (const auto& [k, v] : part.metadata) out.metadata[k] = v;
  }
  if (index.contains("metadata") && index["metadata"].contains("total_size") &&
      index["metadata"]["total_size"].is_number_integer())
    CAI_CHECK(index["metadata"]["total_size"].get<int64_t>() == total,
              "[checkpoint] {}: metadata.total_size {} but the tensors hold {} bytes", index_path,
              index["metadata"]["total_size"].get<int64_t>(), total);
  return out;
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  CAI_CHECK(fd >= 0, "[checkpoint] cannot open {} to flush it: {}", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  CAI_CHECK(rc == 0, "[checkpoint] fsync of {} failed: {}", path, std::strerror(err));
}

AtomicDir::AtomicDir(std::string final_path, std::string tmp_path, bool replace)
    : final_(std::move(final_path)), tmp_(std::move(tmp_path)), replace_(replace) {
  CAI_CHECK(replace_ || !fs::exists(final_),
            "[checkpoint] {} exists already: checkpoints are never written "
            "over",
            final_);
  if (tmp_.empty()) tmp_ = final_ + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp_);
  fs::create_directories(tmp_);
}

AtomicDir::~AtomicDir() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

void AtomicDir::flush_files() {
  for (const auto& e : fs::directory_iterator(tmp_))
    if (e.is_regular_file()) fsync_path(e.path().string(), false);
}

void AtomicDir::commit() {
  CAI_CHECK(!committed_, "[checkpoint] {} committed twice", final_);
  flush_files();
  fsync_path(tmp_, true);
  std::error_code ec;
  std::string old;
  if (replace_ && fs::exists(final_)) {
    // One atomic swap where the file system has it (Linux renameat2): `final_` names a complete
    // directory at every instant, the old one before, the new one after; the old one is then
    // removed under the temporary name. Elsewhere two renames, with a window between them in
    // which `final_` does not exist (a `latest` naming it would dangle until the next save).
    if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, final_.c_str(), RENAME_EXCHANGE) == 0) {
      fs::remove_all(tmp_, ec);
      const fs::path parent = fs::path(final_).parent_path();
      fsync_path(parent.empty() ? "." : parent.string(), true);
      committed_ = true;
      return;
    }
    old = final_ + ".old-" + std::to_string(::getpid());
    fs::remove_all(old);
    fs::rename(final_, old, ec);
    CAI_CHECK(!ec, "[checkpoint] cannot rename {} to {}: {}", final_, old, ec.message());
  }
  fs::rename(tmp_, final_, ec);
  CAI_CHECK(!ec, "[checkpoint] cannot rename {} to {}: {}", tmp_, final_, ec.message());
  if (!old.empty()) fs::remove_all(old, ec);
  const fs::path parent = fs::path(final_).parent_path();
  fsync_path(parent.empty() ? "." : parent.string(), true);
  committed_ = true;
}

}  // namespace cai::checkpoint
