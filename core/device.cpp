#include "core/device.h"

#include "core/error.h"

namespace quiver {

namespace {
DeviceBackend*& slot(DeviceKind kind) {
  static DeviceBackend* cuda = nullptr;
  if (kind != DeviceKind::CUDA) throw Error("the CPU has no device backend");
  return cuda;
}
}  // namespace

void register_device_backend(DeviceKind kind, DeviceBackend* backend) { slot(kind) = backend; }

DeviceBackend* device_backend(DeviceKind kind) {
  return kind == DeviceKind::CPU ? nullptr : slot(kind);
}

DeviceBackend& backend_for(Device device) {
  DeviceBackend* backend = device_backend(device.kind);
  if (!backend)
    throw Error(cat(device.str(), ": this build of Quiver has no CUDA backend (configure with "
                                  "QUIVER_CUDA=ON where the CUDA toolkit is installed)"));
  int count = backend->device_count();
  if (device.index < 0 || device.index >= count) {
    const std::string why = count == 0 ? backend->why_no_devices() : std::string();
    throw Error(cat(device.str(), ": no such device (", count, " CUDA device", count == 1 ? "" : "s", " visible",
                    why.empty() ? std::string() : cat("; the CUDA driver says ", why), ")"));
  }
  return *backend;
}

}  // namespace quiver
