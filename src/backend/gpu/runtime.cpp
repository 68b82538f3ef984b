// RAII runtime handles and device facts (see runtime.h).
#include "backend/gpu/runtime.h"

#include <cstdlib>
#include <cstring>

#include "backend/gpu/launch.h"

#include <fmt/format.h>

#include <mutex>
#include <vector>

namespace parity::gpu {

void check(Error_t e, const char* what) {
  if (e == kSuccess) return;
  throw GpuError(fmt::format("{}: {} error {} ({}): {}", what, kVendorRuntime, error_name(e),
                             static_cast<int>(e), error_string(e)));
}

void check_last_launch(const char* what) {
  const Error_t e = get_last_error();
  if (e == kSuccess) return;
  throw GpuError(fmt::format("kernel {}: launch failed: {} error {}: {}", what, kVendorRuntime,
                             error_name(e), error_string(e)));
}

int device_count() noexcept {
  int n = 0;
  if (get_device_count(&n) != kSuccess) {
    (void)get_last_error();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string no_device_reason() {
  int n = 0;
  const Error_t e = get_device_count(&n);
  if (e != kSuccess) {
    (void)get_last_error();
    return fmt::format("no usable GPU: {} runtime reports {} ({})", kVendorRuntime, error_name(e),
                       error_string(e));
  }
  if (n == 0) return fmt::format("no usable GPU: the {} runtime sees 0 devices", kVendorRuntime);
  return {};
}

namespace {

DeviceInfo query(int device) {
  DeviceInfo d;
  d.device = device;
  char name[256] = {0};
  check(device_name(device, name, sizeof(name)), "device_name");
  d.name = name;
  char uuid[41] = {};
  check(device_uuid(device, uuid), "device_uuid");
  d.uuid = uuid;
  auto attr = [device](Attribute a, const char* what) {
    int v = 0;
    check(device_attribute(&v, a, device), what);
    return v;
  };
  d.multiprocessor_count = attr(Attribute::multiprocessor_count, "multiprocessor_count");
  d.warp_size = attr(Attribute::warp_size, "warp_size");
  d.l2_cache_bytes = attr(Attribute::l2_cache_bytes, "l2_cache_bytes");
  d.shared_memory_per_block =
      static_cast<std::size_t>(attr(Attribute::shared_memory_per_block, "shared_memory_per_block"));
  d.shared_memory_per_block_optin = static_cast<std::size_t>(
      attr(Attribute::shared_memory_per_block_optin, "shared_memory_per_block_optin"));
  if (d.shared_memory_per_block_optin < d.shared_memory_per_block) {
    d.shared_memory_per_block_optin =
        d.shared_memory_per_block;  // HIP reports 0 (CUDA-only attribute)
  }
  d.max_threads_per_block = attr(Attribute::max_threads_per_block, "max_threads_per_block");
  d.max_threads_per_multiprocessor =
      attr(Attribute::max_threads_per_multiprocessor, "max_threads_per_multiprocessor");
  d.max_grid[0] = attr(Attribute::max_grid_x, "max_grid_x");
  d.max_grid[1] = attr(Attribute::max_grid_y, "max_grid_y");
  d.max_grid[2] = attr(Attribute::max_grid_z, "max_grid_z");
  d.compute_major = attr(Attribute::compute_major, "compute_major");
  d.compute_minor = attr(Attribute::compute_minor, "compute_minor");
  std::size_t free_bytes = 0;
  check(mem_get_info(&free_bytes, &d.total_memory_bytes), "mem_get_info");
  if (d.warp_size != 32 && d.warp_size != 64) {
    throw GpuError(fmt::format("device {} ({}) reports warp size {}, expected 32 or 64", device,
                               d.name, d.warp_size));
  }
  return d;
}

}  // namespace

const DeviceInfo& device_info() {
  static std::mutex mutex;
  static std::vector<DeviceInfo*> cache;  // leaked on purpose: read by kernels' launchers at exit
  int device = 0;
  check(get_device(&device), "get_device");
  std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() <= static_cast<std::size_t>(device)) cache.resize(device + 1, nullptr);
  if (cache[device] == nullptr) cache[device] = new DeviceInfo(query(device));
  return *cache[device];
}

std::pair<std::size_t, std::size_t> memory_info() {
  std::size_t free_bytes = 0, total_bytes = 0;
  check(mem_get_info(&free_bytes, &total_bytes), "mem_get_info");
  return {free_bytes, total_bytes};
}

// ---------------------------------------------------------------- streams --

Stream::Stream() {
  check(stream_create(&s_), "stream_create");
}
Stream::~Stream() {
  if (s_ != nullptr) (void)stream_destroy(s_);
}
Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (s_ != nullptr) (void)stream_destroy(s_);
    s_ = std::exchange(o.s_, nullptr);
  }
  return *this;
}
void Stream::synchronize() const {
  check(stream_synchronize(s_), "stream_synchronize");
}

Event::Event() {
  check(event_create(&e_), "event_create");
}
Event::~Event() {
  if (e_ != nullptr) (void)event_destroy(e_);
}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_ != nullptr) (void)event_destroy(e_);
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}
void Event::record(Stream_t s) const {
  check(event_record(e_, s), "event_record");
}
void Event::synchronize() const {
  check(event_synchronize(e_), "event_synchronize");
}
void Event::wait_on(Stream_t s) const {
  check(stream_wait_event(s, e_), "stream_wait_event");
}
float Event::elapsed_ms(const Event& start, const Event& stop) {
  stop.synchronize();
  float ms = 0.0f;
  check(event_elapsed_ms(&ms, start.e_, stop.e_), "event_elapsed_ms");
  return ms;
}

// ---------------------------------------------------------------- buffers --

namespace detail {

void* device_alloc(std::size_t bytes, const char* what) {
  void* p = nullptr;
  const Error_t e = malloc_device(&p, bytes);
  if (e != kSuccess) {
    (void)get_last_error();
    std::size_t free_bytes = 0, total_bytes = 0;
    (void)mem_get_info(&free_bytes, &total_bytes);
    throw GpuError(
        fmt::format("{}: cannot allocate {:.3f} GB of device memory ({} free of {:.3f} GB): {} {}; "
                    "use a smaller batch or fewer/smaller tables on this device",
                    what, bytes / 1e9, fmt::format("{:.3f} GB", free_bytes / 1e9),
                    total_bytes / 1e9, error_name(e), error_string(e)));
  }
  return p;
}
void device_free(void* p) noexcept {
  if (p != nullptr) (void)free_device(p);
}
void* host_alloc(std::size_t bytes, const char* what) {
  void* p = nullptr;
  const Error_t e = malloc_host(&p, bytes);
  if (e != kSuccess) {
    (void)get_last_error();
    throw GpuError(fmt::format("{}: cannot allocate {:.3f} GB of pinned host memory: {} {}", what,
                               bytes / 1e9, error_name(e), error_string(e)));
  }
  return p;
}
void host_free(void* p) noexcept {
  if (p != nullptr) (void)free_host(p);
}
void copy(void* dst, const void* src, std::size_t bytes, Stream_t s, const char* what) {
  if (bytes == 0) return;
  check(memcpy_async(dst, src, bytes, s), what);
}
void copy_sync(void* dst, const void* src, std::size_t bytes, const char* what) {
  if (bytes == 0) return;
  // Ordered after all earlier work on every stream (ours are non-blocking): simple and safe for
  // set-up and checks, never used on a training step's path.
  check(device_synchronize(), what);
  check(memcpy_async(dst, src, bytes, nullptr), what);
  check(stream_synchronize(nullptr), what);
}
void zero(void* p, std::size_t bytes, Stream_t s, const char* what) {
  if (bytes == 0) return;
  check(memset_async(p, 0, bytes, s), what);
}

void validate_launch(const char* name, const void* kernel, const LaunchShape& shape) {
  const DeviceInfo& d = device_info();
  if (shape.grid < 1 || shape.grid > d.max_grid[0]) {
    throw GpuError(fmt::format("kernel {}: grid of {} blocks is outside [1, {}] on {}", name,
                               shape.grid, d.max_grid[0], d.name));
  }
  if (shape.block < 1 || shape.block > d.max_threads_per_block || shape.block % d.warp_size != 0) {
    throw GpuError(fmt::format(
        "kernel {}: block of {} threads must be a multiple of the warp size {} in [1, {}] on {}",
        name, shape.block, d.warp_size, d.max_threads_per_block, d.name));
  }
  if (shape.smem > d.shared_memory_per_block_optin) {
    throw GpuError(
        fmt::format("kernel {}: {} bytes of dynamic shared memory exceed the {} bytes a "
                    "block may use on {}",
                    name, shape.smem, d.shared_memory_per_block_optin, d.name));
  }
  if (shape.smem > d.shared_memory_per_block) {
    check(func_set_max_dynamic_shared_memory(kernel, static_cast<int>(shape.smem)),
          fmt::format("kernel {}: raising the dynamic shared-memory limit to {} bytes", name,
                      shape.smem)
              .c_str());
  }
}

void after_launch(const char* name, Stream_t stream) {
  check_last_launch(name);
  static const bool sync_each = [] {
    const char* v = std::getenv("PARITY_GPU_SYNC_LAUNCHES");
    return v != nullptr && std::strcmp(v, "0") != 0 && v[0] != '\0';
  }();
  if (sync_each) {
    const Error_t e = stream_synchronize(stream);
    if (e != kSuccess) {
      throw GpuError(fmt::format("kernel {}: failed while running: {} error {}: {}", name,
                                 kVendorRuntime, error_name(e), error_string(e)));
    }
  }
}

}  // namespace detail

// ------------------------------------------------------------- rehearsal --

namespace {
thread_local bool t_rehearsing = false;
}  // namespace

bool rehearsing() {
  return t_rehearsing;
}
RehearsalScope::RehearsalScope() : outer_(t_rehearsing) {
  t_rehearsing = true;
}
RehearsalScope::~RehearsalScope() {
  t_rehearsing = outer_;
}

}  // namespace parity::gpu
