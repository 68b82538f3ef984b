#include "backend/gpu/operand_cache.h"

#include <algorithm>

#include "backend/gpu/convert.h"

namespace parity::gpu {

void OperandCache::hold(const void* p, std::size_t bytes) {
  if (p == nullptr || bytes == 0) return;
  const auto b = reinterpret_cast<std::uintptr_t>(p);
  held_.push_back({b, b + bytes});
}

void OperandCache::release() {
  held_.clear();
  for (auto& c : copies_) c.valid = false;
}

void OperandCache::forget(const void* p, std::size_t bytes) {
  const auto b = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t e = b + std::max<std::size_t>(bytes, 1);
  std::erase_if(held_, [&](const Range& h) { return h.begin < e && b < h.end; });
  std::erase_if(copies_, [&](const Copy& c) {
    const auto a = reinterpret_cast<std::uintptr_t>(c.key.data);
    return a >= b && a < e;
  });
}

bool OperandCache::is_held(CMat m) const {
  if (m.rows <= 0 || m.cols <= 0) return false;
  const auto b = reinterpret_cast<std::uintptr_t>(m.data);
  const auto e = reinterpret_cast<std::uintptr_t>(m.data + (m.rows - 1) * m.ld + m.cols);
  return std::any_of(held_.begin(), held_.end(),
                     [&](const Range& h) { return b >= h.begin && e <= h.end; });
}

// Made on first use, its contents not yet valid. Copies of another batch size that are not in use
// this step are freed first (an evaluation's short last batch would otherwise keep a second set
// of copies for the rest of the run).
OperandCache::Copy& OperandCache::slot_for(CMat m, std::int64_t ld) {
  const Key key{m.data, m.rows, m.cols, m.ld};
  for (auto& c : copies_)
    if (c.key == key) return c;
  std::erase_if(copies_, [&](const Copy& c) { return !c.valid && c.key.rows != m.rows; });
  copies_.push_back(
      {key,
       DeviceBuffer<Bf16>(static_cast<std::size_t>(m.rows * ld), "bf16 copy of a held operand"),
       false});
  ++allocations_;
  return copies_.back();
}

const Bf16* OperandCache::find(CMat m, std::int64_t ld, Stream_t s) {
  if (!is_held(m)) return nullptr;
  Copy& c = slot_for(m, ld);
  if (!c.valid) {
    convert_padded(s, m, AMat(c.bf16.data(), DType::bf16, m.rows, m.cols, ld));
    c.valid = true;
  }
  return c.bf16.data();
}

Bf16* OperandCache::written_with(CMat m, std::int64_t ld) {
  Copy& c = slot_for(m, ld);
  c.valid = true;
  return c.bf16.data();
}

}  // namespace parity::gpu
