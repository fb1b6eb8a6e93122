// The GPU's sensors through NVML, the driver's libnvidia-ml.so.1 loaded at run time (no link-time
// dependency: the build hosts have the CUDA toolkit but no driver): the energy counter, the SM
// clock and the power draw of the GPU behind a CUDA device index (matched by PCI bus id, so
// CUDA_VISIBLE_DEVICES and NVML's own numbering may differ).
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <map>
#include <mutex>

#include "kernels/device.h"

namespace cai::kernels::cuda {

namespace {

// NVML's C interface, the few entries used (nvml.h: nvmlReturn_t is an enum, 0 = success;
// NVML_CLOCK_SM = 1).
using nvmlDevice = struct nvmlDevice_st*;
struct Nvml {
  int (*init)() = nullptr;
  int (*by_pci)(const char*, nvmlDevice*) = nullptr;
  int (*energy)(nvmlDevice, unsigned long long*) = nullptr;  // mJ since the driver loaded
  int (*clock)(nvmlDevice, int, unsigned int*) = nullptr;    // MHz
  int (*power)(nvmlDevice, unsigned int*) = nullptr;         // mW
  bool ok = false;
};

const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    auto sym = [h](const char* name) { return dlsym(h, name); };
    n.init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
    n.by_pci = reinterpret_cast<int (*)(const char*, nvmlDevice*)>(
        sym("nvmlDeviceGetHandleByPciBusId_v2"));
    n.energy = reinterpret_cast<int (*)(nvmlDevice, unsigned long long*)>(
        sym("nvmlDeviceGetTotalEnergyConsumption"));
    n.clock =
        reinterpret_cast<int (*)(nvmlDevice, int, unsigned int*)>(sym("nvmlDeviceGetClockInfo"));
    n.power = reinterpret_cast<int (*)(nvmlDevice, unsigned int*)>(sym("nvmlDeviceGetPowerUsage"));
    n.ok = n.init && n.by_pci && n.energy && n.clock && n.power && n.init() == 0;
  });
  return n;
}

// The NVML handle of CUDA device `device`, looked up once (not at every read).
nvmlDevice handle_of(const Nvml& n, int device) {
  static std::mutex m;
  static std::map<int, nvmlDevice> handles;
  std::lock_guard<std::mutex> lock(m);
  const auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  char bus[32] = {};
  nvmlDevice d = nullptr;
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), device) != cudaSuccess || n.by_pci(bus, &d) != 0)
    d = nullptr;
  handles[device] = d;
  return d;
}

}  // namespace

bool read_sensors(int device, GpuSensors* out) {
  const Nvml& n = nvml();
  if (!n.ok || !out) return false;
  const nvmlDevice d = handle_of(n, device);
  if (!d) return false;
  unsigned long long mj = 0;
  unsigned int mhz = 0, mw = 0;
  if (n.energy(d, &mj) != 0 || n.clock(d, 1, &mhz) != 0 || n.power(d, &mw) != 0) return false;
  out->energy_mj = static_cast<double>(mj);
  out->sm_mhz = mhz;
  out->power_mw = mw;
  return true;
}

}  // namespace cai::kernels::cuda
