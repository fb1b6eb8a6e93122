// The NCCL backend in a build without CUDA: every entry throws cai::NotImplemented naming the
// build option.
#include "cai/core/error.h"
#include "cai/dist/nccl.h"

namespace cai::dist {

namespace {
[[noreturn]] void missing(const char* what) {
  throw NotImplemented(fmt::format(
      "[nccl] {}: this build has no CUDA, so no NCCL backend (configure with -DCAI_WITH_CUDA=ON "
      "on a machine with nvcc and NCCL)",
      what));
}
}  // namespace

bool nccl_compiled() {
  return false;
}

std::unique_ptr<Communicator> make_nccl(Communicator&, int) {
  missing("make_nccl");
}

std::unique_ptr<Communicator> make_nccl(std::unique_ptr<Communicator>, int) {
  missing("make_nccl");
}

int select_cuda_device(int, int) {
  throw NotImplemented(
      "[cuda] select_cuda_device: this build has no CUDA (configure with -DCAI_WITH_CUDA=ON)");
}

}  // namespace cai::dist
