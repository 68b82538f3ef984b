// RAII handles for the GPU runtime: device buffers, pinned host buffers, streams and events,
// plus the device facts kernels are sized from (queried, never assumed).
//
// Why it is built this way:
// - Every resource has one owner that frees it in its destructor; the handles are move-only.
//   Destructors never throw (a failed free during unwinding would terminate).
// - Every runtime call goes through check(), which throws GpuError naming the call, the vendor
//   error and what to do; library code never prints or exits (only tools/ does).
// - device_count() is the one call that does not throw: tests use it to skip cleanly where no
//   GPU (or no driver) is present.
// - DeviceInfo is read once per device from the runtime: warp size, multiprocessor count, L2 and
//   shared-memory limits are never host constants.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#include "backend/gpu/port.h"
#include "parity/error.h"

namespace parity::gpu {

// Concatenates the arguments with operator<<. For messages in files compiled by nvcc, which
// cannot include fmt (its constexpr machinery fails under nvcc's host pass); .cpp files use fmt.
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// A failed GPU runtime call or kernel launch.
class GpuError : public Error {
 public:
  using Error::Error;
};

// Throws GpuError "<what>: <vendor error name>: <description>" unless e is success.
void check(Error_t e, const char* what);
// Throws GpuError naming `what` when the last launch on this thread failed.
void check_last_launch(const char* what);

// Number of usable devices; 0 where there is no GPU or no driver (never throws).
int device_count() noexcept;
// A one-line reason why no device is usable (for test skips), empty when one is.
std::string no_device_reason();

struct DeviceInfo {
  int device = 0;
  std::string name;
  std::string uuid;  // "GPU-...", as nvidia-smi prints it
  int multiprocessor_count = 0;
  int warp_size = 0;  // 32 on NVIDIA, 64 on CDNA
  std::int64_t l2_cache_bytes = 0;
  std::size_t shared_memory_per_block = 0;        // default dynamic + static limit
  std::size_t shared_memory_per_block_optin = 0;  // after raising a kernel's limit
  int max_threads_per_block = 0;
  int max_threads_per_multiprocessor = 0;  // resident threads an SM (CU) holds
  int max_grid[3] = {0, 0, 0};
  int compute_major = 0;
  int compute_minor = 0;
  std::size_t total_memory_bytes = 0;
};
// The current device's facts (read once per device, then cached).
const DeviceInfo& device_info();

// (free, total) bytes of device memory now.
std::pair<std::size_t, std::size_t> memory_info();

// ---------------------------------------------------------------- streams --

class Stream {
 public:
  Stream();  // a new non-blocking stream
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept;
  Stream_t get() const { return s_; }
  void synchronize() const;

 private:
  Stream_t s_ = nullptr;
};

class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept;
  Event_t get() const { return e_; }
  void record(Stream_t s) const;
  void synchronize() const;
  // Work enqueued on s after this call waits until the event's recorded work is done.
  void wait_on(Stream_t s) const;
  // Milliseconds between two recorded events (synchronises on stop).
  static float elapsed_ms(const Event& start, const Event& stop);

 private:
  Event_t e_ = nullptr;
};

// -------------------------------------------------------------- rehearsal --

// A rehearsal (GpuBackend::rehearse) runs a sequence of ops so that each sizes its scratch and
// workspaces and plans its library calls, with nothing enqueued: while a RehearsalScope is open
// on a thread, launch(), the BLAS products, the vendor sort and the ops' memsets on that thread
// return without enqueuing work. Host-side preparation (allocation, plans) still happens.
bool rehearsing();
class RehearsalScope {
 public:
  RehearsalScope();
  ~RehearsalScope();
  RehearsalScope(const RehearsalScope&) = delete;
  RehearsalScope& operator=(const RehearsalScope&) = delete;

 private:
  bool outer_;
};

// ---------------------------------------------------------------- buffers --

namespace detail {
void* device_alloc(std::size_t bytes, const char* what);
void device_free(void* p) noexcept;
void* host_alloc(std::size_t bytes, const char* what);
void host_free(void* p) noexcept;
void copy(void* dst, const void* src, std::size_t bytes, Stream_t s, const char* what);
void copy_sync(void* dst, const void* src, std::size_t bytes, const char* what);
void zero(void* p, std::size_t bytes, Stream_t s, const char* what);
}  // namespace detail

// n elements of T in device memory, uninitialised. Move-only; frees on destruction.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n, const char* what = "DeviceBuffer")
      : p_(static_cast<T*>(n ? detail::device_alloc(n * sizeof(T), what) : nullptr)), n_(n) {}
  ~DeviceBuffer() { detail::device_free(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      detail::device_free(p_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  T* data() const { return p_; }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return n_ * sizeof(T); }

  // Host <-> device copies of the first n elements. The *_sync forms wait for all work on the
  // device first and block until the copy is done (set-up and checks, not the step path).
  void upload(const T* host, std::size_t n, Stream_t s) {
    detail::copy(p_, host, n * sizeof(T), s, "upload");
  }
  void download(T* host, std::size_t n, Stream_t s) const {
    detail::copy(host, p_, n * sizeof(T), s, "download");
  }
  void upload_sync(const T* host, std::size_t n) {
    detail::copy_sync(p_, host, n * sizeof(T), "upload");
  }
  void download_sync(T* host, std::size_t n) const {
    detail::copy_sync(host, p_, n * sizeof(T), "download");
  }
  void zero(Stream_t s) { detail::zero(p_, bytes(), s, "zero"); }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

// Device-to-device (or any direction) asynchronous copy on stream s.
inline void copy_async(void* dst, const void* src, std::size_t bytes, Stream_t s) {
  detail::copy(dst, src, bytes, s, "copy_async");
}

}  // namespace parity::gpu
